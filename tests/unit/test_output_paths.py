"""The output-file check runs in every rank of a torchrun launch at once: two processes probing one name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptbench.cli import params
from ckptbench.errors import UsageError


def test_a_name_another_process_is_probing_is_accepted(tmp_path: Path, monkeypatch):
    target = tmp_path / "plot.png"
    real_open = os.open

    def racing_open(path, flags, *args, **kwargs):
        if os.fspath(path) in (str(target), target.name) and flags & os.O_EXCL:
            os.close(real_open(path, flags, *args, **kwargs))  # the other rank's probe lands first ...
            return real_open(path, flags, *args, **kwargs)  # ... so ours finds the name taken
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(params.os, "open", racing_open)
    assert params.check_output_file(str(target)) == target


def test_a_probe_removed_by_the_other_process_is_no_error(tmp_path: Path, monkeypatch):
    target = tmp_path / "plot.png"
    real_unlink = os.unlink

    def racing_unlink(path, *args, **kwargs):
        real_unlink(path, *args, **kwargs)  # the other rank removed our probe first
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(params.os, "unlink", racing_unlink)
    assert params.check_output_file(str(target)) == target
    assert not target.exists()


def test_real_problems_are_still_refused(tmp_path: Path):
    with pytest.raises(UsageError, match="does not exist"):
        params.check_output_file(str(tmp_path / "missing" / "plot.png"))
    with pytest.raises(UsageError, match="File name too long"):
        params.check_output_file(str(tmp_path / ("x" * 300)))


def test_a_directory_swapped_between_the_probe_and_its_removal_loses_nothing(tmp_path: Path, monkeypatch):
    """Output into a directory someone else controls: after the probe is created, they rename the directory
    and put a symlink to a directory of the victim's in its place, holding a file of the probe's name. The
    probe's removal stays in the directory the probe was made in; the victim's file stays."""
    shared, victims = tmp_path / "shared", tmp_path / "victims"
    shared.mkdir()
    victims.mkdir()
    (victims / "report.html").write_text("the victim's report")
    real_open = os.open

    def swapping_open(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if os.fspath(path) in ("report.html", str(shared / "report.html")) and flags & os.O_EXCL:
            shared.rename(tmp_path / "moved")
            shared.symlink_to(victims)
        return fd

    monkeypatch.setattr(params.os, "open", swapping_open)
    assert params.check_output_file(str(shared / "report.html")) == shared / "report.html"
    assert (victims / "report.html").read_text() == "the victim's report"
    assert not (tmp_path / "moved" / "report.html").exists()  # the probe itself is gone


def test_a_failed_runs_result_file_is_removed_from_its_own_directory_only(tmp_path: Path):
    """--output into a directory someone else controls: a run that fails removes its result file; if the
    directory was swapped for a symlink to a directory of the victim's meanwhile, holding a file of the same
    name, the removal still happens in the directory the file was made in, and the victim's file stays."""
    from ckptbench.cli.render import open_output

    shared, victims = tmp_path / "shared", tmp_path / "victims"
    shared.mkdir()
    victims.mkdir()
    result = open_output(shared, "bench")
    (victims / result.path.name).write_text("the victim's result")
    shared.rename(tmp_path / "moved")
    shared.symlink_to(victims)
    result.discard()
    assert (victims / result.path.name).read_text() == "the victim's result"
    assert not (tmp_path / "moved" / result.path.name).exists()
    assert result.dir_fd is None  # closed


def test_a_result_file_is_written_where_it_was_made(tmp_path: Path):
    from ckptbench.cli.render import open_output

    result = open_output(tmp_path / "new" / "dirs", "bench")
    result.write('{"ok": true}')
    assert result.path.read_text() == '{"ok": true}' and result.dir_fd is None

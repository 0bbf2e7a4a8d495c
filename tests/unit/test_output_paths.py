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

    def racing_open(path, flags, *args):
        if os.fspath(path) == str(target) and flags & os.O_EXCL:
            real_open(path, flags, *args)  # the other rank's probe lands first ...
            return real_open(path, flags, *args)  # ... so ours finds the name taken
        return real_open(path, flags, *args)

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

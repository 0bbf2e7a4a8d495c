"""Disk full (a guarantee in docs/guarantees.md; the command line): ``bench`` on a tiny tmpfs that fills up in the
middle of the run stops with one line saying so (and what the run needed), exit 2, no traceback,
and its scratch directory removed, for the filesystem sweep and the checkpoint workload's writers.

The free-space check before a run would refuse these runs, so the disk fills after it: a file is
written right after the check passes (as another process would), or the checks are bypassed.
Runs in-process (CliRunner re-raises anything the command does not turn into its error line).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from ckptbench.storage.local_target import LocalDirectory
from ckptbench.storage.store import LocalStore

MiB = 2**20
ERROR_LINE = re.compile(r"^ckptbench: error: (?P<target>\S+) ran out of space during the run \((?P<reason>.+)\): "
                        r"the run needs [\d.]+ MiB, [\d.]+ (B|KiB|MiB) was free when it started \(free space .*\)$")


def assert_one_disk_full_line(result, where: Path) -> re.Match:
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    match = ERROR_LINE.match(lines[0])
    assert match, lines[0]
    assert match["target"] == str(where)
    return match


@pytest.fixture
def filled_after_the_check(monkeypatch):
    """The next ``bench`` run's free-space check passes; right after it, ``leave`` bytes stay free."""

    def arm(where: Path, leave: int) -> None:
        real = LocalDirectory.require_free

        def check_then_fill(self: LocalDirectory, needed_bytes: int) -> None:
            real(self, needed_bytes)
            with open(where / "filler", "wb") as f:
                f.write(b"\1" * (shutil.disk_usage(where).free - leave))

        monkeypatch.setattr(LocalDirectory, "require_free", check_then_fill)

    return arm


@pytest.fixture
def no_space_checks(monkeypatch):
    """Every free-space check passes or is skipped (as on a filesystem that reports no size)."""
    monkeypatch.setattr(LocalDirectory, "require_free", lambda self, needed_bytes: None)
    monkeypatch.setattr(LocalStore, "free_bytes", lambda self: None)


@pytest.mark.parametrize("flags", [
    ("--threads", "1"),
    ("--threads", "1,2", "--buffered", "--no-read", "--schedule", "per-file"),
], ids=["direct", "buffered-per-file"])
def test_the_fs_sweep_stops_on_a_disk_that_fills_up(cli, mount_fs, filled_after_the_check, flags):
    where = mount_fs("tmpfs", "size=48m")
    filled_after_the_check(where, leave=4 * MiB)
    result = cli("bench", str(where), "--size", "32MiB", "--block-size", "1MiB", "--repeat", "1", "--warmup", "0",
                 *flags)
    match = assert_one_disk_full_line(result, where)
    assert match["reason"].startswith("No space left on device")
    assert os.listdir(where) == ["filler"]  # the scratch directory is gone


def test_the_fs_sweep_stops_in_its_metadata_phase(cli, mount_fs, no_space_checks):
    where = mount_fs("tmpfs", "size=2m")
    result = cli("bench", str(where), "--size", "1MiB", "--threads", "1", "--repeat", "1", "--warmup", "0",
                 "--no-read", "--metadata")
    assert_one_disk_full_line(result, where)
    assert os.listdir(where) == []


def test_the_checkpoint_workload_stops_on_a_disk_that_fills_up(cli, mount_fs, filled_after_the_check):
    where = mount_fs("tmpfs", "size=160m")
    filled_after_the_check(where, leave=12 * MiB)  # less than the 16 MiB checkpoint: its save stops mid-run
    result = cli("bench", str(where), "--workload", "checkpoint", "--size", "16MiB", "--repeat", "1",
                 "--warmup", "0")
    assert_one_disk_full_line(result, where)
    assert os.listdir(where) == ["filler"]


@pytest.mark.parametrize("writer", ["ckptbench", "torch", "safetensors", "fio"])
def test_each_checkpoint_writer_stops_on_a_full_disk(cli, mount_fs, no_space_checks, writer: str):
    if writer == "safetensors":
        pytest.importorskip("safetensors")
    if writer == "fio" and shutil.which("fio") is None:
        pytest.skip("fio is not installed")
    where = mount_fs("tmpfs", "size=8m")
    result = cli("bench", str(where), "--workload", "checkpoint", "--size", "32MiB", "--repeat", "1",
                 "--warmup", "0", "--writers", writer)
    assert_one_disk_full_line(result, where)
    assert os.listdir(where) == []


def test_an_io_error_on_a_disk_with_room_is_one_line_too_and_not_called_a_full_disk(cli, tmp_path: Path,
                                                                                   monkeypatch):
    from ckptbench import native

    def failing(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(native, "write", failing)
    result = cli("bench", str(tmp_path), "--size", "1MiB", "--threads", "1", "--repeat", "1", "--warmup", "0")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "ckptbench: error: 1 thr x 128 KiB: write 1/1 failed: [Errno 5] Input/output error"]  # 1 MiB: 8 files of 128 KiB
    assert os.listdir(tmp_path) == []


def test_a_competitor_writer_that_fails_is_named_and_the_others_are_measured(cli, tmp_path: Path, monkeypatch):
    """A competitor's failure (a server quirk, a missing feature) leaves the run going without it: the other
    writers' results come out, the failure is a warning with its one-line cause, and the exit status is 1."""
    from ckptbench.bench import writers

    def failing(self, state_dict, directory):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file "
                           "data/3: file write failed\nmore C++ context")

    monkeypatch.setattr(writers.TorchSaveContender, "_save", failing)
    result = cli("bench", str(tmp_path), "--workload", "checkpoint", "--size", "4MiB", "--repeat", "1",
                 "--warmup", "0", "--writers", "ckptbench,torch", "--format", "json")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    document = json.loads(result.stdout)
    assert [r["writer"] for r in document["results"]] == ["ckptbench"] and document["data_verified"] is True
    [failure] = document["failed_writers"]
    assert failure["writer"] == "torch" and failure["during"] == "its save/load round 1/1"
    assert failure["error"].startswith("save at ") and "PytorchStreamWriter failed writing file data/3" in failure["error"]
    assert "writer-failed" in [w["code"] for w in document["warnings"]]
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == "ckptbench: error: 1 of 2 writers failed (torch); the others' results are complete"
    assert any(line.startswith("warning: torch failed during its save/load round 1/1") for line in lines), lines
    assert os.listdir(tmp_path) == []


def test_a_competitor_that_fails_in_the_warm_up_is_left_out_of_every_later_round(cli, tmp_path: Path, monkeypatch):
    from ckptbench.bench import writers

    calls = []

    def failing(self, state_dict, directory):
        calls.append(directory)
        raise RuntimeError('S3Exception: Client error: Internal S3 client error: Header "ETag" not found')

    monkeypatch.setattr(writers.TorchSaveContender, "_save", failing)
    result = cli("bench", str(tmp_path), "--workload", "checkpoint", "--size", "4MiB", "--repeat", "2",
                 "--warmup", "1", "--writers", "torch,ckptbench")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert len(calls) == 1  # tried once, in the warm-up
    assert "torch: failed during its save/load round warm-up 1/1, no results" in result.stdout
    assert "ckptbench" in result.stdout and os.listdir(tmp_path) == []
    assert "completion without an ETag, as Ceph RGW 16 does" in result.stderr  # a known cause is explained


def test_a_failure_of_ckptbench_itself_in_a_competitors_round_ends_the_run(cli, tmp_path: Path, monkeypatch):
    """What ckptbench does around a competitor's save and load (counting its files, making its reads cold,
    removing it) is ckptbench's own: a failure there ends the run, not the competitor's part in it."""
    from ckptbench.bench import shootout
    from ckptbench.errors import StorageIOError

    real = shootout.LocalPlaces.files

    def files(self, location: Path) -> tuple[int, int]:
        if location.name.startswith("torch-"):
            raise StorageIOError(f"listing {location} failed (injected)")
        return real(self, location)

    monkeypatch.setattr(shootout.LocalPlaces, "files", files)
    result = cli("bench", str(tmp_path), "--workload", "checkpoint", "--size", "4MiB", "--repeat", "1",
                 "--warmup", "0", "--writers", "ckptbench,torch", "--format", "json")
    assert result.exit_code == 1 and result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("ckptbench: error: listing ") and lines[-1].endswith("failed (injected)"), lines
    assert not any("torch failed" in line for line in lines), lines
    assert os.listdir(tmp_path) == []


def _loads_other_bytes(monkeypatch, contender: type) -> None:
    """``contender``'s loads come back with one tensor's bytes changed (a writer that lost data)."""
    real = contender._load

    def load(self, directory):
        loaded = real(self, directory)
        key = next(iter(loaded))
        loaded[key] = loaded[key].clone().view(-1).add_(1).view(loaded[key].shape)
        return loaded

    monkeypatch.setattr(contender, "_load", load)


def test_a_competitor_whose_load_does_not_match_is_left_out(cli, tmp_path: Path, monkeypatch):
    from ckptbench.bench import writers

    _loads_other_bytes(monkeypatch, writers.TorchSaveContender)
    result = cli("bench", str(tmp_path), "--workload", "checkpoint", "--size", "4MiB", "--repeat", "1",
                 "--warmup", "0", "--writers", "ckptbench,torch", "--format", "json")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    document = json.loads(result.stdout)
    assert [r["writer"] for r in document["results"]] == ["ckptbench"]
    [failure] = document["failed_writers"]
    assert failure["writer"] == "torch" and "loaded with different bytes than were saved" in failure["error"]
    assert os.listdir(tmp_path) == []


def test_ckptbench_loading_other_bytes_than_it_saved_ends_the_run_beside_competitors(cli, tmp_path: Path,
                                                                                   monkeypatch):
    from ckptbench.bench import writers

    _loads_other_bytes(monkeypatch, writers.CkptbenchContender)
    result = cli("bench", str(tmp_path), "--workload", "checkpoint", "--size", "4MiB", "--repeat", "1",
                 "--warmup", "0", "--writers", "torch,ckptbench", "--format", "json")
    assert result.exit_code == 1 and result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("ckptbench: error: ckptbench: ") and "loaded with different bytes" in lines[-1], lines
    assert os.listdir(tmp_path) == []


def test_a_competitor_that_fails_in_its_async_round_has_no_results_at_all(cli, tmp_path: Path, monkeypatch):
    """dcp's sync save and load succeed, its async save fails when waited for: it is left out of both the
    sync results and the async ones (a writer with a failure has no results), the others are complete."""
    from ckptbench.bench import writers

    real = writers.DcpContender.save_async

    def failing_async(self, state_dict, directory):
        pending = real(self, state_dict, directory)

        def wait() -> None:
            pending.wait()
            raise OSError(5, "the upload was lost (injected)")

        return writers.PendingSave(pending.done, wait)

    monkeypatch.setattr(writers.DcpContender, "save_async", failing_async)
    result = cli("bench", str(tmp_path), "--workload", "checkpoint", "--size", "4MiB", "--repeat", "1",
                 "--warmup", "0", "--writers", "ckptbench,dcp", "--format", "json")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    document = json.loads(result.stdout)
    assert [r["writer"] for r in document["results"]] == ["ckptbench"]
    assert [a["writer"] for a in document["async"]] == ["ckptbench"]
    [failure] = document["failed_writers"]
    assert failure["writer"] == "dcp" and failure["during"] == "its async round 1/1"
    assert "the upload was lost (injected)" in failure["error"]
    assert os.listdir(tmp_path) == []


def test_a_failing_dcp_rank_is_named_by_its_own_error(cli, tmp_path: Path, monkeypatch):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    def failing(*args, **kwargs):
        raise CheckpointException("save", {0: (PermissionError(13, "Permission denied"), None)})

    monkeypatch.setattr(dcp, "save", failing)
    result = cli("bench", str(tmp_path), "--workload", "checkpoint", "--size", "4MiB", "--repeat", "1",
                 "--warmup", "0", "--writers", "dcp")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptbench: error: dcp: save at "), lines
    assert lines[0].endswith(" failed: PermissionError: [Errno 13] Permission denied")
    assert os.listdir(tmp_path) == []


def test_a_page_cache_drop_that_fails_is_one_line_not_a_traceback(cli, tmp_path: Path, monkeypatch):
    """Making a checkpoint cold before its load is ckptbench's own step: when the fdatasync or fadvise of a
    file fails (an I/O error on the device), the run ends with one line naming it, exit 1."""
    from ckptbench.bench import shootout

    def not_permitted(self):
        raise PermissionError(13, "Permission denied")  # as for a user who is not root: the fadvise path

    def failing(fd, offset, length, advice):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(shootout.CacheDropper, "_drop_all", not_permitted)
    monkeypatch.setattr(shootout.os, "posix_fadvise", failing)
    result = cli("bench", str(tmp_path), "--workload", "checkpoint", "--size", "4MiB", "--repeat", "1",
                 "--warmup", "0")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("ckptbench: error: could not drop ") and "Input/output error" in lines[-1]

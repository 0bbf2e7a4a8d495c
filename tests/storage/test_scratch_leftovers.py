"""Scratch directories that killed runs leave behind: each records its owner (host, pid namespace, boot,
pid, start time); a run warns about the ones whose process is gone on this host and names their bytes when
the free-space check fails; :func:`remove_leftovers` removes only those, and never through a symlink or
into another filesystem."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckptbench.errors import InsufficientSpaceError
from ckptbench.storage import local_target, owner
from ckptbench.storage.local_target import (
    NOT_A_DIRECTORY,
    SCRATCH_OWNER,
    SCRATCH_PREFIX,
    UNKNOWN_OWNER,
    LocalDirectory,
    find_leftovers,
    remove_leftovers,
)
from ckptbench.units import format_size

#: A run that writes 256 KiB in its scratch directory and is SIGKILLed there.
_KILLED_RUN = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from ckptbench.storage.local_target import LocalDirectory
    with LocalDirectory(Path(sys.argv[1])).scratch() as scratch:
        (scratch / "shard-00000.bin").write_bytes(os.urandom(256 << 10))
        (scratch / "sub").mkdir()
        (scratch / "sub" / "more.bin").write_bytes(b"x" * 4096)
        os.kill(os.getpid(), signal.SIGKILL)
""")


def killed_run(where: Path) -> Path:
    """The scratch directory a real run left in ``where`` when it was SIGKILLed."""
    before = set(os.listdir(where))
    done = subprocess.run([sys.executable, "-c", _KILLED_RUN, str(where)], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    (left,) = set(os.listdir(where)) - before
    return where / left


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(local_target, "_WARNED", set())


@pytest.fixture
def planted(scratch_leftover):
    return scratch_leftover


def test_a_scratch_directory_records_this_process_as_its_owner(tmp_path: Path) -> None:
    with LocalDirectory(tmp_path).scratch() as scratch:
        recorded = owner.ProcessOwner.decode((scratch / SCRATCH_OWNER).read_bytes())
        assert recorded == owner.ProcessOwner.me()
        assert recorded.state() == owner.LIVE
        assert find_leftovers(tmp_path) == []  # this process's own scratch directory is not a leftover
    assert list(tmp_path.iterdir()) == []


def test_a_killed_runs_leftover_is_warned_about_sized_and_removed(tmp_path: Path, caplog) -> None:
    left = killed_run(tmp_path)
    (found,) = find_leftovers(tmp_path)
    assert found.path == left and found.state == owner.DEAD and found.removable
    assert found.size_bytes >= (256 << 10) + 4096
    caplog.set_level(logging.WARNING, logger="ckptbench.storage.local_target")
    with LocalDirectory(tmp_path).scratch():
        pass
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert str(left) in line and "killed run" in line and f"ckptbench clean {tmp_path}" in line and "KiB" in line
    removed, kept = remove_leftovers(tmp_path)
    assert [f.path for f in removed] == [left] and kept == []
    assert list(tmp_path.iterdir()) == []


def test_each_leftover_is_warned_about_once_per_process(tmp_path: Path, caplog) -> None:
    killed_run(tmp_path)
    caplog.set_level(logging.WARNING, logger="ckptbench.storage.local_target")
    target = LocalDirectory(tmp_path)
    for _ in range(2):
        with target.scratch():
            pass
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_the_free_space_error_names_the_leftovers_bytes(tmp_path: Path, planted) -> None:
    dead = killed_run(tmp_path)
    unknown = planted(tmp_path, "1-old", None)
    sizes = {f.path: format_size(f.size_bytes) for f in find_leftovers(tmp_path)}
    with pytest.raises(InsufficientSpaceError) as raised:
        LocalDirectory(tmp_path).require_free(1 << 62)
    text = str(raised.value)
    assert f"1 scratch directory left by killed runs there holds {sizes[dead]}" in text
    assert f"1 scratch directory of unknown owner there holds {sizes[unknown]}" in text
    assert f"ckptbench clean {tmp_path}" in text


def test_a_live_process_another_host_and_an_unknown_owner_are_kept(tmp_path: Path, planted) -> None:
    me = owner.ProcessOwner.me()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        start = None
        while start is None:  # its /proc entry appears with the process
            start = owner.process_start(child.pid)
        live_child = planted(tmp_path, f"{child.pid}-live", dataclasses.replace(me, pid=child.pid,
                                                                                  process_start=start))
        this_process = planted(tmp_path, f"{os.getpid()}-me", me)
        elsewhere = planted(tmp_path, "1-elsewhere", dataclasses.replace(me, host=me.host + "-other", pid=1))
        unknown = planted(tmp_path, "2-old", None)
        removed, kept = remove_leftovers(tmp_path)
        assert removed == []
        states = {f.path: f.state for f in kept}
        assert states == {live_child: owner.LIVE, this_process: owner.LIVE, elsewhere: owner.OTHER_HOST,
                          unknown: UNKNOWN_OWNER}
        assert all(f.why_kept for f in kept)
        assert all((p / "shard-00000.bin").is_file() for p in states)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    # the same directory, once its process is gone
    (gone,) = [f for f in find_leftovers(tmp_path) if f.path == live_child]
    assert gone.state == owner.DEAD


def test_a_reused_pid_is_not_the_owner(tmp_path: Path, planted) -> None:
    """This process's pid, but another start time: the process that made it is gone."""
    me = owner.ProcessOwner.me()
    left = planted(tmp_path, f"{os.getpid()}-reused", dataclasses.replace(me, process_start="1"))
    removed, _ = remove_leftovers(tmp_path)
    assert [f.path for f in removed] == [left] and not left.exists()


def test_another_pid_namespace_is_another_host(tmp_path: Path, planted) -> None:
    me = owner.ProcessOwner.me()
    planted(tmp_path, "3-container", dataclasses.replace(me, pid=3, pid_namespace="pid:[1]"))
    (found,) = find_leftovers(tmp_path)
    assert found.state == owner.OTHER_HOST


@pytest.mark.skipif(not owner.machine_id(), reason="this machine has no /etc/machine-id")
def test_another_boot_of_this_machine_is_dead_only_where_no_other_machine_reaches(tmp_path: Path, planted,
                                                                                monkeypatch) -> None:
    """This host's name and machine id, another boot: on a local disk this machine restarted since the run, so
    it is dead; on a network filesystem it may be a clone of this machine (one image) running now: kept."""
    earlier = dataclasses.replace(owner.ProcessOwner.me(), boot_id="an-earlier-boot")
    planted(tmp_path, "5-rebooted", earlier)
    monkeypatch.setattr(local_target, "mount_of", lambda path: local_target.MountInfo("/", "srv:/x", "nfs4", ""))
    (found,) = find_leftovers(tmp_path)
    assert found.state == owner.OTHER_BOOT and remove_leftovers(tmp_path)[0] == []
    monkeypatch.setattr(local_target, "mount_of", lambda path: local_target.MountInfo("/", "/dev/vda", "ext4", ""))
    removed, _ = remove_leftovers(tmp_path)
    assert [f.state for f in removed] == [owner.DEAD]


def test_a_record_that_is_not_one_is_an_unknown_owner(tmp_path: Path, planted) -> None:
    for i, body in enumerate([b"", b"{", b'{"host": 1}', b"[]", b'{"pid": -1}']):
        path = planted(tmp_path, f"{i}-bad", None)
        (path / SCRATCH_OWNER).write_bytes(body)
    assert {f.state for f in find_leftovers(tmp_path)} == {UNKNOWN_OWNER}
    assert remove_leftovers(tmp_path)[0] == []


def test_a_record_nested_past_the_json_parsers_depth_is_an_unknown_owner(tmp_path: Path, planted) -> None:
    path = planted(tmp_path, "1-nested", None)
    (path / SCRATCH_OWNER).write_bytes(b"[" * 4000)
    assert [f.state for f in find_leftovers(tmp_path)] == [UNKNOWN_OWNER]
    assert remove_leftovers(tmp_path)[0] == [] and path.exists()


def test_a_symlink_named_like_a_scratch_directory_redirects_no_delete(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.bin").write_bytes(b"p" * 100)
    (victim / SCRATCH_OWNER).write_bytes(owner.ProcessOwner(**{**dataclasses.asdict(owner.ProcessOwner.me()),
                                                               "process_start": "1"}).encode())
    target = tmp_path / "target"
    target.mkdir()
    link = target / f"{SCRATCH_PREFIX}1-link"
    link.symlink_to(victim)
    removed, kept = remove_leftovers(target)
    assert removed == [] and [(f.path, f.state) for f in kept] == [(link, NOT_A_DIRECTORY)]
    assert link.is_symlink() and sorted(os.listdir(victim)) == sorted(["precious.bin", SCRATCH_OWNER])


def test_symlinks_inside_a_leftover_are_removed_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.bin").write_bytes(b"p" * 100)
    target = tmp_path / "target"
    target.mkdir()
    left = killed_run(target)
    (left / "to-dir").symlink_to(outside)
    (left / "to-file").symlink_to(outside / "precious.bin")
    (left / "sub" / "deeper").symlink_to(outside)
    (found,) = find_leftovers(target)
    assert found.removable
    remove_leftovers(target)
    assert os.listdir(target) == [] and os.listdir(outside) == ["precious.bin"]


def test_only_names_with_the_prefix_are_touched(tmp_path: Path) -> None:
    left = killed_run(tmp_path)
    (tmp_path / "ckptbench-scratch-1-x").mkdir()  # no leading dot: not a scratch directory's name
    (tmp_path / "keep.bin").write_bytes(b"k")
    nested = tmp_path / "sub"
    nested.mkdir()
    os.rename(killed_run(tmp_path), nested / f"{SCRATCH_PREFIX}9-nested")  # not directly in the target
    removed, _ = remove_leftovers(tmp_path)
    assert [f.path for f in removed] == [left]
    assert sorted(os.listdir(tmp_path)) == ["ckptbench-scratch-1-x", "keep.bin", "sub"]
    assert os.listdir(nested) == [f"{SCRATCH_PREFIX}9-nested"]


def test_a_dry_run_removes_nothing(tmp_path: Path) -> None:
    left = killed_run(tmp_path)
    removed, _ = remove_leftovers(tmp_path, dry_run=True)
    assert [f.path for f in removed] == [left] and (left / "shard-00000.bin").is_file()


def test_a_mount_point_inside_a_leftover_is_left_alone(tmp_path: Path) -> None:
    left = killed_run(tmp_path)
    mounted = left / "sub" / "mnt"
    mounted.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mounted)],
                      capture_output=True, timeout=10).returncode != 0:
        pytest.skip("cannot mount tmpfs here (needs root and mount permission)")
    try:
        (mounted / "other-fs.bin").write_bytes(b"o" * 100)
        removed, kept = remove_leftovers(tmp_path)
        assert removed == [] and [f.state for f in kept] == [local_target.NOT_REMOVED]
        assert (mounted / "other-fs.bin").read_bytes() == b"o" * 100  # the other filesystem untouched
        assert not (left / "shard-00000.bin").exists()  # the rest of the leftover removed
    finally:
        subprocess.run(["umount", "-l", str(mounted)], capture_output=True, timeout=10)

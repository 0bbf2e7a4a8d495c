"""Trust boundaries: a checkpoint or a target from someone else cannot make ckptbench write, delete or
read outside it, or hang (guarantee 9 in docs/guarantees.md).

Each attack is staged by a second, unprivileged user (``nobody``, through ``setpriv``) in a directory
it can write to; the victim, root, then runs ckptbench there. Every test checks that the attack fails
safely: one clear error (exit 2 and one line for command-line input), the victim's files outside the
target unchanged (compared before and after), and no hang (every step bounded by a timeout).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
import torch
from security_helpers import Arena, Attacker, ckptbench_cli, one_error_line, python

import ckptbench
from ckptbench.checkpoint import Checkpointer
from ckptbench.checkpoint.lock import CheckpointLockedError
from ckptbench.checkpoint.manifest import MANIFEST_NAME, NotACheckpointError
from ckptbench.errors import StorageIOError, UnsafeFileError

REPO = Path(__file__).resolve().parents[2]
BENCH_TINY = ["--size", "4MiB", "--files", "2", "--threads", "1", "--block-size", "1MiB", "--repeat", "1",
              "--warmup", "0"]


def _give_to(attacker: Attacker, path: Path) -> None:
    """Hand ``path`` (a checkpoint root made by the victim) over to the attacker, as a shared or
    downloaded checkpoint would be."""
    for p in [path, *path.rglob("*")]:
        os.lchown(p, attacker.uid, attacker.gid)


def _load_in_child(path: Path, *, extra: str = "") -> subprocess.CompletedProcess:
    """``ckptbench.load(path)`` as root in a fresh interpreter: prints the error's class and message."""
    return python(f"""
        import sys, ckptbench
        {extra}
        try:
            sd = ckptbench.load(sys.argv[1])
        except Exception as exc:
            print("ERROR", type(exc).__name__, str(exc).replace(chr(10), " "))
        else:
            print("LOADED", {{k: bytes(v.numpy()[:64]) for k, v in sd.items()}})
    """, str(path))


# -- 1. a .ckptbench.lock symlink in a checkpoint directory --------------------------------------------------


def test_a_planted_lock_symlink_is_refused_and_its_target_untouched(arena: Arena, attacker: Attacker) -> None:
    ckpt = arena.shared / "ckpt"
    attacker.run("""
        import os, sys
        os.mkdir(sys.argv[1], 0o777)
        os.symlink(sys.argv[2], os.path.join(sys.argv[1], ".ckptbench.lock"))
    """, str(ckpt), str(arena.victim / "important.conf"))
    before = arena.snapshot()
    with pytest.raises(CheckpointLockedError, match="symbolic link"):
        ckptbench.save({"w": torch.ones(4)}, ckpt)
    assert arena.snapshot() == before
    assert (ckpt / ".ckptbench.lock").is_symlink() and not (ckpt / MANIFEST_NAME).exists()


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_lock_that_is_a_link_to_another_file_is_never_written_through(tmp_path: Path, link: str) -> None:
    """The lock file is opened without following a symlink, and one with other hard links (someone
    else's file under the lock's name) is refused before it is truncated."""
    from ckptbench.checkpoint import lock

    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    if link == "symlink":
        (ckpt / lock.LOCK_NAME).symlink_to(victim)
    else:
        os.link(victim, ckpt / lock.LOCK_NAME)
    with pytest.raises(CheckpointLockedError, match="symbolic link" if link == "symlink" else "hard link"):
        ckptbench.save({"w": torch.ones(4)}, ckpt)
    assert victim.read_text() == "keep\n"


@pytest.mark.parametrize("holder", [
    {"acquired_unix_s": "yesterday"}, {"renewed_unix_s": None}, {"ttl_s": float("nan")}, {"pid": "1"},
    {"pid": -5}, {"host": ["a"]}, {"token": {"a": 1}},
])
def test_a_lock_held_with_a_holder_record_of_other_types_is_one_locked_error(tmp_path: Path, holder: dict) -> None:
    """Whoever holds ``.ckptbench.lock`` wrote what it records: a field of another type is an unreadable
    record (the save says the lock is held), not a TypeError from describing its holder."""
    import fcntl

    from ckptbench.checkpoint import lock

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    record = {**json.loads(lock.Holder.me(60.0).encode()), **holder}
    (ckpt / lock.LOCK_NAME).write_text(json.dumps(record))
    with open(ckpt / lock.LOCK_NAME, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(CheckpointLockedError):
            ckptbench.save({"w": torch.ones(4)}, ckpt)
    assert lock.Holder.decode(json.dumps(record).encode()) is None


@pytest.mark.parametrize("sync_path", ["arena", "ring"])
def test_a_shard_name_planted_as_a_hard_link_is_never_written_through(tmp_path: Path, monkeypatch,
                                                                      sync_path: str) -> None:
    """A name a save will create, planted beforehand as a hard link to another file (a save id learned
    or guessed, the next rank's or shard's name once the first appears), is refused, not written into."""
    from ckptbench.checkpoint import saver

    monkeypatch.setattr(saver.secrets, "token_hex", lambda n: "0123abcd")
    if sync_path == "ring":
        monkeypatch.setattr(saver, "ring_bytes", lambda: 0)
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"keep" * 1024)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.link(victim, ckpt / "shard-0123abcd-00000.bin")
    with pytest.raises(UnsafeFileError, match="hard link"):
        ckptbench.save({"w": torch.ones(4096)}, ckpt)
    assert victim.read_bytes() == b"keep" * 1024
    assert not (ckpt / MANIFEST_NAME).exists()


@pytest.mark.parametrize("sync_path", ["arena", "ring"])
def test_a_shard_name_swapped_for_a_hard_link_after_the_check_is_not_written_through(tmp_path: Path, monkeypatch,
                                                                                   sync_path: str) -> None:
    """The shard is created and checked (regular, one link), then, before the engine writes it, its name
    is replaced by a hard link to another file: the engine writes through the descriptor that was
    checked, so the other file keeps its bytes."""
    from ckptbench import native
    from ckptbench.checkpoint import saver

    if sync_path == "ring":
        monkeypatch.setattr(saver, "ring_bytes", lambda: 0)
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"keep" * 4096)
    ckpt = tmp_path / "ckpt"
    real, swapped = native.write, []

    def swap_then_write(jobs, **kwargs):
        for name in {os.path.basename(path) for _, path, _ in jobs if "shard-" in path}:
            os.link(victim, ckpt / f".{name}.planted")
            os.replace(ckpt / f".{name}.planted", ckpt / name)
            swapped.append(name)
        return real(jobs, **kwargs)

    monkeypatch.setattr(native, "write", swap_then_write)
    with contextlib.suppress(UnsafeFileError):  # refusing the save would be as safe as finishing it
        ckptbench.save({"w": torch.ones(16384)}, ckpt, async_=False)
    assert swapped, "the attack never ran: the save did not write its shards through native.write"
    assert victim.read_bytes() == b"keep" * 4096


def test_a_checkpoint_path_planted_as_another_users_symlink_is_not_followed(arena: Arena,
                                                                             attacker: Attacker) -> None:
    """The attacker makes the name the victim will save to a link to the victim's directory."""
    ckpt = arena.shared / "ckpt"
    attacker.run("import os, sys; os.symlink(sys.argv[2], sys.argv[1])", str(ckpt), str(arena.victim))
    before = arena.snapshot()
    with pytest.raises(UnsafeFileError, match="symbolic link made by another user"):
        ckptbench.save({"w": torch.ones(4)}, ckpt)
    with pytest.raises(NotACheckpointError, match="symbolic link made by another user"):
        ckptbench.load(ckpt)
    assert arena.snapshot() == before


# -- 2. a scratch directory swapped for a symlink in a shared, non-sticky target -----------------------------


@pytest.mark.parametrize("command", ["bench", "preflight"])
def test_a_target_others_can_write_without_the_sticky_bit_is_refused(arena: Arena, command: str) -> None:
    args = BENCH_TINY if command == "bench" else ["--measure-size", "24MiB", "--measure-time", "0", "--repeat", "1",
                                                          "--params", "100M"]
    line = one_error_line(ckptbench_cli(command, str(arena.shared), *args))
    assert "writable by every user" in line and "sticky bit" in line and "--force" in line
    assert list(arena.shared.iterdir()) == []


def test_a_sticky_shared_directory_like_tmp_is_accepted(arena: Arena) -> None:
    arena.shared.chmod(0o1777)
    done = ckptbench_cli("bench", str(arena.shared), *BENCH_TINY, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(arena.shared.iterdir()) == []


def test_a_scratch_directory_swapped_for_a_symlink_redirects_no_write_and_no_delete(arena: Arena,
                                                                                   attacker: Attacker) -> None:
    """Forced onto the shared directory: the attacker renames the scratch directory away and puts a
    symlink to the victim's directory in its place, mid-run. Everything the run then writes, reads
    and deletes still happens in its own (renamed) scratch directory."""
    from ckptbench import native
    from ckptbench.storage.local_target import LocalDirectory

    target = LocalDirectory.from_string(str(arena.shared), force=True)
    before = arena.snapshot()
    with target.scratch() as scratch:
        real_name = Path(os.path.realpath(scratch)).name
        attacker.run("""
            import os, sys
            shared, name, victim = sys.argv[1:]
            os.rename(os.path.join(shared, name), os.path.join(shared, "moved-away"))
            os.symlink(victim, os.path.join(shared, name))
        """, str(arena.shared), real_name, str(arena.victim))
        assert (arena.shared / real_name).is_symlink()
        # What the sweep and --metadata do: write shard files, read them, delete them, make a directory.
        data = native.AlignedBuffer(1 << 20)
        native.write([(memoryview(data), str(scratch / "shard-00000.bin"), 0)], threads=1, block_size=1 << 20,
                     direct=False, sync="fdatasync", sync_dir=True)
        native.read([(memoryview(data), str(scratch / "shard-00000.bin"), 0)], threads=1, block_size=1 << 20,
                    direct=False)
        assert (arena.shared / "moved-away" / "shard-00000.bin").stat().st_size == 1 << 20
        (scratch / "shard-00000.bin").unlink()
        (scratch / "metadata-1-0").mkdir()
    assert arena.snapshot() == before  # the victim's shard-00000.bin is still there, unchanged
    assert (arena.shared / real_name).is_symlink()  # the attacker's link: left alone, not followed
    assert list((arena.shared / "moved-away").iterdir()) == []  # the run's files: removed where they were


def test_bench_forced_onto_a_shared_directory_with_an_attacker_racing_it(arena: Arena, attacker: Attacker) -> None:
    """End to end: ``bench --metadata --force`` while the attacker swaps every scratch directory it
    sees for a symlink to the victim's directory. The run ends in a result or one error line; the
    victim's files are untouched either way."""
    racer = attacker.start("""
        import os, sys, time
        shared, victim = sys.argv[1:]
        swapped, end = 0, time.monotonic() + 60
        while time.monotonic() < end and not os.path.exists(os.path.join(shared, "stop")):
            for name in os.listdir(shared):
                if name.startswith(".ckptbench-scratch-"):
                    path = os.path.join(shared, name)
                    if not os.path.islink(path):
                        try:
                            os.rename(path, os.path.join(shared, f"moved-{swapped}"))
                            os.symlink(victim, path)
                            swapped += 1
                        except OSError:
                            pass
        print(swapped)
    """, str(arena.shared), str(arena.victim))
    try:
        before = arena.snapshot()
        done = ckptbench_cli("bench", str(arena.shared), "--force", "--metadata", *BENCH_TINY)
    finally:
        (arena.shared / "stop").touch()
        out, err = racer.communicate(timeout=90)
    assert racer.returncode == 0, err
    assert arena.snapshot() == before
    assert "Traceback" not in done.stderr
    assert done.returncode == 0 or len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    if int(out) == 0:
        pytest.skip("the attacker never saw the scratch directory (the run was too quick); the swap itself is "
                    "covered by test_a_scratch_directory_swapped_for_a_symlink_redirects_no_write_and_no_delete")


# -- 3. report --html through a predictable temp name ------------------------------------------------------


def test_report_html_into_a_shared_directory_writes_through_no_planted_link(arena: Arena, attacker: Attacker) -> None:
    result = sorted((REPO / "results").glob("bench-checkpoint-*.json"))[-1]
    out = arena.shared / "report.html"
    # The attacker links the output name and the temp names a report used to take (.NAME.<pid>.tmp)
    # to the victim's file.
    attacker.run("""
        import os, sys
        shared, victim = sys.argv[1:]
        os.symlink(victim, os.path.join(shared, "report.html"))
        for pid in range(2, 1 << 15):
            os.symlink(victim, os.path.join(shared, f".report.html.{pid}.tmp"))
    """, str(arena.shared), str(arena.victim / "important.conf"))
    before = arena.snapshot()
    done = ckptbench_cli("report", str(result), "--html", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert arena.snapshot() == before
    assert not out.is_symlink() and out.stat().st_uid == os.geteuid()  # the link was replaced, not followed
    assert out.read_text().lstrip().lower().startswith("<!doctype html")
    assert not [p for p in arena.shared.iterdir() if p.name.startswith(".report.html.") and not p.is_symlink()]


# -- 4. a shard replaced by a symlink to a file outside the checkpoint --------------------------------------


def test_a_shard_symlinked_to_a_file_outside_is_never_read(arena: Arena, attacker: Attacker) -> None:
    """The attacker's manifest matches the link in every size check (the tensor's length is the link's
    own size, which is also the secret's size), and has no checksums: only refusing the link stops it."""
    secret = arena.victim / "secret.key"
    secret.write_bytes(b"S" * len(os.fsencode(str(secret))))  # as long as the link that names it
    ckpt = arena.shared / "ckpt"
    with Checkpointer(checksum=False) as ckpt_writer:
        ckpt_writer.save({"x": torch.zeros(secret.stat().st_size, dtype=torch.uint8)}, ckpt)
    _give_to(attacker, ckpt)
    attacker.run("""
        import json, os, sys
        ckpt, secret = sys.argv[1:]
        manifest = json.load(open(os.path.join(ckpt, "manifest.json")))
        shard = manifest["shards"][0]["name"]
        os.remove(os.path.join(ckpt, shard))
        os.symlink(secret, os.path.join(ckpt, shard))
    """, str(ckpt), str(secret))
    before = arena.snapshot()
    done = _load_in_child(ckpt)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ERROR CorruptCheckpointError") and "symbolic link" in done.stdout, done.stdout
    assert "ROOT-ONLY" not in done.stdout and "SSSS" not in done.stdout
    assert arena.snapshot() == before


# -- 5. DCP .metadata is a pickle ---------------------------------------------------------------------------


def _dcp_checkpoint(path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    from ckptbench.integrations.dcp import Writer

    dcp.save({"w": torch.arange(8.0), "step": 3}, storage_writer=Writer(path))


def _dcp_load_in_child(path: Path, safe: bool) -> subprocess.CompletedProcess:
    """The Reader's own answer (``read_metadata``, then ``dcp.load``) as root in a fresh interpreter:
    ``ERROR <class of the Reader's error> <message>`` (dcp.load wraps what a reader raises in its
    CheckpointException: the Reader's message is what it carries)."""
    return python("""
        import sys, torch, torch.distributed.checkpoint as dcp
        from ckptbench.integrations.dcp import Reader
        sd = {"w": torch.zeros(8), "step": 0}
        reader = Reader(sys.argv[1], safe=sys.argv[2] == "1")
        try:
            reader.read_metadata()
        except Exception as exc:
            print("ERROR", type(exc).__name__, str(exc).replace(chr(10), " ")[:500])
        try:
            dcp.load(sd, storage_reader=reader)
        except BaseException as exc:
            print("DCP", type(exc).__name__, str(exc).replace(chr(10), " ")[:3000])
        else:
            print("LOADED", sd["w"].tolist(), sd["step"])
    """, str(path), "1" if safe else "0")


def test_dcp_safe_mode_refuses_a_metadata_pickle_that_runs_code(arena: Arena, attacker: Attacker) -> None:
    ckpt = arena.shared / "dcp"
    _dcp_checkpoint(ckpt)
    _give_to(attacker, ckpt)
    marker = arena.root / "code-ran"
    attacker.run("""
        import os, pickle, sys
        ckpt, marker = sys.argv[1:]

        class Evil:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        with open(os.path.join(ckpt, ".metadata"), "wb") as f:
            pickle.dump(Evil(), f)
    """, str(ckpt), str(marker))
    done = _dcp_load_in_child(ckpt, safe=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ERROR NotACheckpointError") and "posix.system" in done.stdout, done.stdout
    assert "a safe load does not build" in done.stdout.split("DCP", 1)[1]  # what dcp.load's error says
    assert not marker.exists()


@pytest.mark.parametrize("module, name", [
    ("torch.distributed.checkpoint.metadata", "os.mkdir"),  # an attribute path through what the module imported
    ("torch.distributed.checkpoint.metadata", "torch.serialization.os.mkdir"),
    ("pathlib", "Path.os.mkdir"),
    ("torch", "serialization.os.mkdir"),
])
def test_dcp_safe_mode_refuses_a_global_reached_through_the_allowed_modules(tmp_path: Path, module: str,
                                                                           name: str) -> None:
    """Pickle protocol 4 looks a dotted global up attribute by attribute: a safe load must build only the
    allowed modules' own classes, never a function one of them imported (its ``os``)."""
    import struct

    from ckptbench.integrations.dcp import Reader

    ckpt = tmp_path / "dcp"
    _dcp_checkpoint(ckpt)
    marker = tmp_path / "code-ran"
    argument = str(marker).encode()
    payload = (b"\x80\x04c" + f"{module}\n{name}\n".encode() + b"(X" + struct.pack("<I", len(argument)) + argument
               + b"tR.")
    (ckpt / ".metadata").write_bytes(payload)
    with pytest.raises(NotACheckpointError, match="a safe load does not build"):
        Reader(ckpt).read_metadata()  # the default: unpickling anything else is the safe=False opt-in
    assert not marker.exists()


def test_dcp_safe_mode_loads_an_honest_checkpoint(tmp_path: Path) -> None:
    _dcp_checkpoint(tmp_path / "dcp")
    done = _dcp_load_in_child(tmp_path / "dcp", safe=True)
    assert done.stdout.strip() == "LOADED [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0] 3", done.stdout + done.stderr


@pytest.mark.parametrize("payload", ["{'not': 'metadata'}", "[1, 2, 3]", "b'x' * 10", "None"])
def test_dcp_metadata_of_the_wrong_kind_is_one_clear_error(tmp_path: Path, payload: str) -> None:
    """A pickle that is not DCP metadata (a dict made the reader raise AttributeError)."""
    import pickle

    ckpt = tmp_path / "dcp"
    _dcp_checkpoint(ckpt)
    (ckpt / ".metadata").write_bytes(pickle.dumps(eval(payload)))  # noqa: S307 - a literal of this test
    for safe in (False, True):
        done = _dcp_load_in_child(ckpt, safe=safe)
        assert done.stdout.startswith("ERROR NotACheckpointError") and "not DCP metadata" in done.stdout, \
            done.stdout + done.stderr[-1000:]
        assert "AttributeError" not in done.stdout


def test_dcp_data_file_symlinked_outside_is_never_read(arena: Arena, attacker: Attacker) -> None:
    ckpt = arena.shared / "dcp"
    _dcp_checkpoint(ckpt)
    _give_to(attacker, ckpt)
    attacker.run("""
        import os, sys
        ckpt, secret = sys.argv[1:]
        for name in os.listdir(ckpt):
            if name.endswith(".distcp"):
                os.remove(os.path.join(ckpt, name))
                os.symlink(secret, os.path.join(ckpt, name))
    """, str(ckpt), str(arena.victim / "secret.key"))
    done = _dcp_load_in_child(ckpt, safe=False)
    assert done.stdout.startswith("DCP") and "CorruptCheckpointError" in done.stdout, done.stdout
    assert "symbolic link" in done.stdout and "ROOT-ONLY" not in done.stdout


# -- 6. special files and absurd sizes -----------------------------------------------------------------------


@pytest.fixture
def planted(arena: Arena, attacker: Attacker):
    """A small checkpoint in the shared directory, handed to the attacker; ``plant(name, kind)`` has the
    attacker replace ``name`` (``manifest.json`` or ``shard``) with a symlink, FIFO or device link."""
    ckpt = arena.shared / "ckpt"
    ckptbench.save({"x": torch.arange(256, dtype=torch.uint8)}, ckpt)
    _give_to(attacker, ckpt)

    def plant(name: str, kind: str) -> Path:
        manifest = json.loads((ckpt / MANIFEST_NAME).read_text())
        name = manifest["shards"][0]["name"] if name == "shard" else name
        attacker.run("""
            import os, sys
            path, kind = sys.argv[1:]
            os.remove(path)
            if kind == "fifo":
                os.mkfifo(path, 0o666)
            elif kind == "zero":
                os.symlink("/dev/zero", path)
            elif kind == "dir":
                os.mkdir(path)
        """, str(ckpt / name), kind)
        return ckpt

    return plant


@pytest.mark.parametrize(("name", "kind", "error", "says"), [
    ("manifest.json", "zero", "NotACheckpointError", "symbolic link"),
    ("manifest.json", "fifo", "NotACheckpointError", "FIFO"),
    ("manifest.json", "dir", "NotACheckpointError", "directory"),
    ("shard", "zero", "CorruptCheckpointError", "symbolic link"),
    ("shard", "fifo", "CorruptCheckpointError", "FIFO"),
])
def test_special_files_in_a_checkpoint_fail_at_once(planted, arena: Arena, name: str, kind: str, error: str,
                                                    says: str) -> None:
    ckpt = planted(name, kind)
    before = arena.snapshot()
    done = _load_in_child(ckpt)  # bounded: a FIFO that hung the load fails the test by its timeout
    assert done.stdout.startswith(f"ERROR {error}") and says in done.stdout, done.stdout + done.stderr[-1000:]
    assert arena.snapshot() == before


def _forge(ckpt: Path, attacker: Attacker, edit: str) -> None:
    """Have the attacker rewrite the manifest of ``ckpt``: ``edit`` is Python run on ``m`` (the manifest)."""
    attacker.run(f"""
        import json, os, sys
        path = os.path.join(sys.argv[1], "manifest.json")
        m = json.load(open(path))
        {edit}
        os.remove(path)
        json.dump(m, open(path, "w"))
    """, str(ckpt))


def test_a_huge_sparse_shard_matching_its_manifest_is_refused_before_allocating(arena: Arena,
                                                                              attacker: Attacker) -> None:
    ckpt = arena.shared / "ckpt"
    ckptbench.save({"x": torch.arange(256, dtype=torch.uint8)}, ckpt)
    _give_to(attacker, ckpt)
    size = attacker.run("""
        import json, os, sys
        ckpt = sys.argv[1]
        m = json.load(open(os.path.join(ckpt, "manifest.json")))
        shard = os.path.join(ckpt, m["shards"][0]["name"])
        for size in (2**50, 2**44, 2**40):  # 1 PiB, or the largest file the filesystem allows
            try:
                os.truncate(shard, size)
                break
            except OSError:
                continue
        print(size)
    """, str(ckpt))
    size = int(size)
    _forge(ckpt, attacker, f"""m["checksum"] = None
        m["shards"][0]["nbytes"] = {size}
        m["tensors"][0].update(shape=[{size}], nbytes={size}, crc32c=None)""")
    done = _load_in_child(ckpt)
    assert done.stdout.startswith("ERROR InsufficientMemoryError") and "host memory" in done.stdout, \
        done.stdout + done.stderr[-1000:]


@pytest.mark.parametrize("shape", [[0, 2**64], [2**62, 2**62, 0], [0] * 65])
def test_shapes_no_tensor_can_have_are_a_clear_error(tmp_path: Path, shape: list[int]) -> None:
    ckpt = tmp_path / "ckpt"
    ckptbench.save({"x": torch.zeros(0, dtype=torch.uint8)}, ckpt)
    manifest = json.loads((ckpt / MANIFEST_NAME).read_text())
    manifest["tensors"][0]["shape"] = shape
    (ckpt / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(NotACheckpointError, match="no tensor can have"):
        ckptbench.load(ckpt)


@pytest.mark.parametrize("shape", [[2**62, 2**62], [2**40, 2**40, 0], [1] * 65])
def test_numpy_shapes_no_array_can_have_are_a_clear_error(tmp_path: Path, shape: list[int]) -> None:
    """A numpy entry of a dtype of no bytes (``|V0``) is not bounded by its tensor's bytes: its shape is
    checked on its own, as a tensor's, rather than handed to numpy to overflow."""
    import numpy as np

    ckpt = tmp_path / "ckpt"
    ckptbench.save({"a": np.zeros(0, dtype=np.uint8)}, ckpt)
    manifest = json.loads((ckpt / MANIFEST_NAME).read_text())
    (key, node), = manifest["skeleton"]["__dict__"]
    node["__numpy__"].update(dtype="|V0", shape=shape, scalar=False)
    (ckpt / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(NotACheckpointError, match="2\\*\\*63 elements"):
        ckptbench.load(ckpt)


def test_duplicate_keys_in_a_manifest_are_rejected(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckptbench.save({"x": torch.ones(2)}, ckpt)
    text = (ckpt / MANIFEST_NAME).read_text()
    (ckpt / MANIFEST_NAME).write_text(text.replace('"skeleton":', '"skeleton":{"__dict__":[]},"skeleton":', 1))
    with pytest.raises(NotACheckpointError, match="appears twice"):
        ckptbench.load(ckpt)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "nested", "huge"])
def test_hostile_config_files_are_one_line_and_no_hang(arena: Arena, attacker: Attacker, kind: str) -> None:
    config = arena.shared / "ckptbench.toml"
    if kind == "dev-zero":
        config = Path("/dev/zero")
    else:
        attacker.run("""
            import os, sys
            path, kind = sys.argv[1:]
            if kind == "fifo":
                os.mkfifo(path, 0o666)
            elif kind == "nested":
                open(path, "w").write("[interval]\\nx = " + "[" * 5000 + "]" * 5000 + "\\n")
            else:
                with open(path, "wb") as f:
                    f.truncate(1 << 40)  # sparse: a terabyte of zeros
        """, str(config), kind)
    done = ckptbench_cli("--config", str(config), "interval", "--ckpt-time", "60s", "--mtbf", "3h")
    line = one_error_line(done)
    assert str(config) in line or "config" in line


# -- 7. unbounded work from small inputs ---------------------------------------------------------------------


def test_a_tiny_file_size_is_refused_before_planning_millions_of_files(tmp_path: Path) -> None:
    line = one_error_line(ckptbench_cli("bench", str(tmp_path), "--file-size", "1", "--size", "64MiB"))
    assert "--file-size" in line and "100000" in line


def test_a_huge_threads_list_is_refused(tmp_path: Path) -> None:
    """200,000 thread counts (a config file: too long for one command-line argument)."""
    config = tmp_path / "sweep.toml"
    config.write_text("[bench]\nthreads = [" + ", ".join(["1"] * 200_000) + "]\n")
    line = one_error_line(ckptbench_cli("--config", str(config), "bench", str(tmp_path / "x")))
    assert "threads" in line and "200000 values" in line and "256" in line


def test_running_out_of_inodes_is_refused_up_front_and_says_inodes(mount_fs) -> None:
    small = mount_fs("tmpfs", "size=64m,nr_inodes=16")
    line = one_error_line(ckptbench_cli("bench", str(small), *BENCH_TINY, "--metadata"))
    assert "inodes" in line and "free space" not in line


# -- 8. smaller ---------------------------------------------------------------------------------------------


def test_a_session_token_without_key_and_secret_is_one_line() -> None:
    line = one_error_line(ckptbench_cli("bench", "s3://bucket/x", "--storage-option", "token=CANARYtoken",
                                        "--endpoint-url", "http://127.0.0.1:9", "--size", "1MiB"))
    assert "token" in line and "key and secret" in line and "CANARYtoken" not in line


def test_a_failed_save_into_new_nested_directories_removes_them(tmp_path: Path, monkeypatch) -> None:
    import errno

    from ckptbench.storage.store import LocalStore

    def broken_write(self, files, **kwargs):
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(LocalStore, "write_files", broken_write)
    with pytest.raises(StorageIOError, match="injected"):
        ckptbench.save({"x": torch.ones(4)}, tmp_path / "a" / "b" / "c")
    assert list(tmp_path.iterdir()) == []


def test_preflight_names_its_own_size_option_and_prints_absurd_sizes_sanely(tmp_path: Path) -> None:
    line = one_error_line(ckptbench_cli("preflight", str(tmp_path), "--measure-size", "1e30"))
    assert "--measure-size" in line and "1e+30 B" in line and "PiB" not in line


def test_victim_snapshot_sees_a_change(arena: Arena) -> None:
    """The before/after comparison the tests rely on does notice a write, a removal and a chmod."""
    before = arena.snapshot()
    (arena.victim / "important.conf").write_text("changed\n")
    assert arena.snapshot() != before
    before = arena.snapshot()
    (arena.victim / "shard-00000.bin").unlink()
    assert arena.snapshot() != before
    before = arena.snapshot()
    (arena.victim / "secret.key").chmod(stat.S_IRUSR)
    assert arena.snapshot() != before

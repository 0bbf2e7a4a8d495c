"""Fuzzing: checkpoints whose files hypothesis replaces by symlinks (to a file outside, to /dev/zero,
dangling, to another shard) and special files (FIFOs, directories), with the manifest made to agree
with them or not. Loading one, or saving over it, ends in a ckptbench error or a correct result:
never a hang, a file outside read or written, or another exception."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import ckptbench
from ckptbench.checkpoint import Checkpointer
from ckptbench.checkpoint.manifest import MANIFEST_NAME
from ckptbench.errors import CkptbenchError

#: Bound of one example: a load or save that blocks (a FIFO opened for reading) fails the test here.
EXAMPLE_TIMEOUT_S = 30

TARGETS = ["manifest.json", "shard-0", "shard-1", ".ckptbench.lock"]
KINDS = ["link-outside", "link-dev-zero", "link-dangling", "link-other-shard", "fifo", "directory"]


@contextlib.contextmanager
def _bounded(seconds: int) -> Iterator[None]:
    def expired(*_: object) -> None:
        raise TimeoutError(f"no answer within {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _replace(ckpt: Path, name: str, kind: str, outside: Path, other: str) -> None:
    path = ckpt / name
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    else:
        path.unlink(missing_ok=True)
    if kind == "link-outside":
        path.symlink_to(outside)
    elif kind == "link-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "link-dangling":
        path.symlink_to(ckpt / "nowhere")
    elif kind == "link-other-shard":
        path.symlink_to(other)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.sampled_from(TARGETS), kind=st.sampled_from(KINDS), agree=st.booleans(),
       checksum=st.booleans(), operation=st.sampled_from(["load", "save"]))
# Always: a directory named manifest.json under an overwriting save (refused before a shard is written, not
# a raw IsADirectoryError at the commit's rename).
@example(target="manifest.json", kind="directory", agree=False, checksum=False, operation="save")
def test_symlinks_and_special_files_in_a_checkpoint(target: str, kind: str, agree: bool, checksum: bool,
                                                    operation: str) -> None:
    state = {"a": torch.arange(3000, dtype=torch.uint8), "b": torch.arange(4000, dtype=torch.int16)}
    with tempfile.TemporaryDirectory(prefix="ckptbench-fuzz-") as tmp:
        root = Path(tmp)
        outside = root / "outside.bin"
        outside.write_bytes(b"OUTSIDE-" * 1000)
        before = _digest(outside)
        ckpt = root / "ckpt"
        with Checkpointer(shard_size=4096, checksum=checksum) as writer:
            writer.save(state, ckpt)
        manifest = json.loads((ckpt / MANIFEST_NAME).read_text())
        shards = [s["name"] for s in manifest["shards"]]
        assert len(shards) >= 2
        name = shards[int(target[-1])] if target.startswith("shard-") else target
        _replace(ckpt, name, kind, outside, shards[1 - int(target[-1])] if target.startswith("shard-") else shards[0])
        if agree and name in shards and (ckpt / name).is_symlink():  # the manifest claims the link's own size
            manifest["shards"][shards.index(name)]["nbytes"] = (ckpt / name).lstat().st_size
            (ckpt / MANIFEST_NAME).write_text(json.dumps(manifest))
        with _bounded(EXAMPLE_TIMEOUT_S):
            try:
                if operation == "load":
                    loaded = ckptbench.load(ckpt)
                    assert name == ".ckptbench.lock", f"{name} as {kind} loaded"  # nothing else may load
                    assert all(torch.equal(loaded[k], v) for k, v in state.items())
                else:
                    ckptbench.save(state, ckpt, overwrite=True)
                    assert torch.equal(ckptbench.load(ckpt)["b"], state["b"])
            except CkptbenchError:
                pass  # the clear error: refused, damaged, locked
        assert _digest(outside) == before
        assert not (root / "nowhere").exists()

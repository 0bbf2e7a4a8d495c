"""CheckpointManager under the loops training scripts run: save every N steps, killed outright and resumed from
the newest step that loads, a damaged newest step skipped and then replaced by the resumed loop, retention."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench.checkpoint.manager import step_dirname


def state(step: int) -> dict:
    return {"model": {"w": torch.full((256, 64), float(step)), "b": torch.arange(64) + step}, "step": step}


def damage(directory: Path) -> None:
    shard = next(p for p in directory.iterdir() if p.name.startswith("shard-"))
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_a_loop_resumed_past_a_damaged_step_replaces_it_and_keeps_loadable_steps(tmp_path: Path, caplog):
    with ckptbench.CheckpointManager(tmp_path, keep_last=2) as manager:
        for step in (10, 20, 30, 40):
            manager.save(step, state(step))
    damage(tmp_path / step_dirname(40))

    with ckptbench.CheckpointManager(tmp_path, keep_last=2) as manager:
        resumed = manager.load()  # the newest step that loads
        assert resumed["step"] == 30
        for step in range(resumed["step"] + 5, 51, 5):  # the loop goes on, saving every 5 steps, async
            manager.save(step, state(step), async_=True)
            if step == 35:
                manager.wait()
                assert manager.steps() == [30, 35, 40]  # 40 is damaged: two loadable steps kept beside it
        manager.wait()
        assert manager.steps() == [45, 50]
        for step in manager.steps():
            assert torch.equal(manager.load(step)["model"]["w"], state(step)["model"]["w"])
    assert "step 40" in caplog.text and "replaces it" in caplog.text


def test_a_step_saved_again_without_a_damaged_copy_still_needs_overwrite(tmp_path: Path):
    with ckptbench.CheckpointManager(tmp_path) as manager:
        manager.save(1, state(1))
        assert manager.load()["step"] == 1
        with pytest.raises(ckptbench.CheckpointExistsError, match="overwrite=True"):
            manager.save(1, state(1))


def test_an_explicit_load_of_a_damaged_step_raises_and_marks_it(tmp_path: Path):
    with ckptbench.CheckpointManager(tmp_path, keep_last=1) as manager:
        manager.save(5, state(5))
        damage(tmp_path / step_dirname(5))
        with pytest.raises(ckptbench.CorruptCheckpointError):
            manager.load(5)
        manager.save(5, state(5))  # replaces it: a resumed run that saves the same step again
        assert torch.equal(manager.load(5)["model"]["b"], state(5)["model"]["b"])


def test_a_step_that_failed_one_read_but_loads_again_is_returned_and_never_replaced(tmp_path: Path, monkeypatch,
                                                                                    caplog):
    """A flaky read (a bit flipped in transit) fails a step's checksum once: read again, it loads, and the
    manager neither falls back to an older step nor lets the next save of that step replace it."""
    from ckptbench.checkpoint.api import Checkpointer

    with ckptbench.CheckpointManager(tmp_path) as manager:
        manager.save(1, state(1))
        manager.save(2, state(2))
    real, failed = Checkpointer.load, []

    def flaky(self, path, *args, **kwargs):
        if not failed:
            failed.append(path)
            raise ckptbench.CorruptCheckpointError(f"{path}: checksum mismatch (a flaky read)")
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(Checkpointer, "load", flaky)
    with ckptbench.CheckpointManager(tmp_path) as manager:
        assert manager.load()["step"] == 2 and failed
        with pytest.raises(ckptbench.CheckpointExistsError, match="overwrite=True"):
            manager.save(2, state(2))  # the good step is not replaced without overwrite
    assert "then loaded when read again" in caplog.text


@pytest.mark.parametrize(("saved", "unknown"), [
    ('{"__dtype__":"bfloat16"}', '{"__dtype__":"float8_e9m9"}'),  # a dtype of a newer torch
    ('"format":"ckptbench.checkpoint/1"', '"format":"ckptbench.checkpoint/2"'),  # a newer ckptbench's manifest
])
def test_a_step_this_torch_or_ckptbench_cannot_read_is_never_replaced(tmp_path: Path, saved: str, unknown: str):
    """Such a step may well be intact (the hint says to load it with the version that wrote it): the resumed
    loop's save of it needs overwrite, as for any committed step."""
    with ckptbench.CheckpointManager(tmp_path) as manager:
        manager.save(10, state(10))
        manager.save(20, {**state(20), "dtype": torch.bfloat16})
    manifest = tmp_path / step_dirname(20) / "manifest.json"
    text = manifest.read_text()
    assert saved in text
    manifest.write_text(text.replace(saved, unknown))
    with ckptbench.CheckpointManager(tmp_path) as manager:
        assert manager.load()["step"] == 10
        with pytest.raises(ckptbench.CheckpointExistsError):
            manager.save(20, state(20))
    assert manifest.read_text() == text.replace(saved, unknown)


def test_map_location_of_a_manager_load(tmp_path: Path):
    with ckptbench.CheckpointManager(tmp_path) as manager:
        manager.save(3, state(3))
        assert manager.load(map_location={"cpu": "meta"})["model"]["w"].device.type == "meta"
        assert manager.load(3, map_location="cpu")["step"] == 3


LOOP = textwrap.dedent("""
    import sys, torch, ckptbench
    root, every, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with ckptbench.CheckpointManager(root, keep_last=2) as manager:
        start = 0
        if manager.latest() is not None:
            start = manager.load()["step"]
        w = torch.full((1 << 18,), float(start))
        for step in range(start + 1, last + 1):
            w += 1  # one training step: w == step afterwards
            if step % every == 0:
                manager.save(step, {"w": w, "step": step}, async_=True)
                print("saving", step, flush=True)
    print("done", flush=True)
""")


def test_a_loop_killed_outright_resumes_from_its_newest_committed_step(tmp_path: Path):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    root = tmp_path / "run"
    loop = subprocess.Popen([sys.executable, str(script), str(root), "2", "1000"], stdout=subprocess.PIPE, text=True)
    try:
        assert loop.stdout is not None
        for line in loop.stdout:
            if line.split() == ["saving", "12"]:
                time.sleep(0.01)  # a save of a later step may be in flight: killed midway
                break
        loop.send_signal(signal.SIGKILL)
    finally:
        loop.wait(timeout=60)
    with ckptbench.CheckpointManager(root, keep_last=2) as manager:
        killed_at = manager.latest()
        assert killed_at is not None and killed_at >= 10
        assert torch.equal(manager.load()["w"], torch.full((1 << 18,), float(killed_at)))
    done = subprocess.run([sys.executable, str(script), str(root), "2", str(killed_at + 8)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:2] == ["saving", str(killed_at + 2)]  # went on from the step it found
    with ckptbench.CheckpointManager(root, keep_last=2) as manager:
        assert manager.steps() == [killed_at + 6, killed_at + 8]
        assert manager.load()["step"] == killed_at + 8
        assert torch.equal(manager.load()["w"], torch.full((1 << 18,), float(killed_at + 8)))
    assert sorted(p.name for p in root.iterdir()) == [step_dirname(killed_at + 6), step_dirname(killed_at + 8)]

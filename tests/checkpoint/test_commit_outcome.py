"""A manifest write whose answer was lost (OutcomeUnknownError from the store): the commit reads the
manifest back for a while; a save whose manifest landed late succeeds; one whose manifest has not
appeared keeps its shards (removing them could break a checkpoint that commits after all)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench.checkpoint import commit as commit_module
from ckptbench.checkpoint import manifest as mf
from ckptbench.errors import CommitOutcomeUnknownError, OutcomeUnknownError


def _lose_the_answer(monkeypatch, lands_on_read: int | None) -> list[int]:
    """mf.commit fails with an unknown outcome; the manifest appears on read-back number ``lands_on_read``."""
    real_commit, pending, reads = mf.commit, {}, [0]

    def commit(store, manifest):
        pending["args"] = (store, manifest)
        raise OutcomeUnknownError(f"writing {store.url}/manifest.json failed: connection closed")

    def current(store):
        reads[0] += 1
        if lands_on_read is not None and reads[0] == lands_on_read:
            real_commit(*pending["args"])
        return commit_module.current_manifest.__wrapped__(store)

    current.__wrapped__ = commit_module.current_manifest
    monkeypatch.setattr(commit_module.mf, "commit", commit)
    monkeypatch.setattr(commit_module, "current_manifest", current)
    monkeypatch.setattr(commit_module, "COMMIT_RECHECK_S", (0.0, 0.0, 0.0))
    return reads


def _shards(path: Path) -> set[str]:
    return {p.name for p in path.iterdir() if p.name.startswith("shard-")}


def test_a_manifest_that_lands_late_is_a_committed_save(tmp_path: Path, monkeypatch):
    path = tmp_path / "c"
    ckptbench.save({"w": torch.zeros(1000)}, path)
    reads = _lose_the_answer(monkeypatch, lands_on_read=3)
    ckptbench.save({"w": torch.ones(1000)}, path, overwrite=True)
    assert reads[0] == 3
    monkeypatch.undo()
    assert torch.equal(ckptbench.load(path)["w"], torch.ones(1000))


def test_a_manifest_that_never_appears_keeps_the_shards_and_the_previous_checkpoint(tmp_path: Path, monkeypatch):
    path = tmp_path / "c"
    ckptbench.save({"w": torch.zeros(1000)}, path)
    before = _shards(path)
    reads = _lose_the_answer(monkeypatch, lands_on_read=None)
    with pytest.raises(CommitOutcomeUnknownError, match="may still commit; its shards are kept"):
        ckptbench.save({"w": torch.ones(1000)}, path, overwrite=True)
    assert reads[0] == 4  # the first read-back and three more
    assert _shards(path) > before  # the new shards are kept
    monkeypatch.undo()
    assert torch.equal(ckptbench.load(path)["w"], torch.zeros(1000))
    ckptbench.save({"w": torch.full((1000,), 2.0)}, path, overwrite=True)  # the next save sweeps them
    assert torch.equal(ckptbench.load(path)["w"], torch.full((1000,), 2.0)) and len(_shards(path)) == 1

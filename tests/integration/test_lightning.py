"""ckptbench.integrations.lightning: a tiny ``Trainer.fit`` that checkpoints through CkptbenchCheckpointIO
(sync and async), then resumes from its checkpoint; skipped where Lightning is not installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ckptbench

lightning = pytest.importorskip("lightning", reason="Lightning is an optional extra: pip install lightning")
from lightning.pytorch import LightningModule, Trainer  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO  # noqa: E402

from ckptbench.integrations.lightning import CkptbenchCheckpointIO  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


class Tiny(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.01)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 2)}

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
        return torch.utils.data.DataLoader(data, batch_size=8)


def trainer(tmp_path: Path, plugin, epochs: int) -> Trainer:
    return Trainer(max_epochs=epochs, default_root_dir=tmp_path, plugins=[plugin], logger=False,
                   enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                   callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=2,
                                              monitor="step", mode="max", every_n_epochs=1)])


@pytest.mark.parametrize("how", ["sync", "async", "lightning_async"])
def test_fit_checkpoints_through_ckptbench_and_resumes(tmp_path: Path, how: str):
    plugin = {"sync": lambda: CkptbenchCheckpointIO(),
              "async": lambda: CkptbenchCheckpointIO(async_=True),
              "lightning_async": lambda: AsyncCheckpointIO(CkptbenchCheckpointIO())}[how]
    torch.manual_seed(0)
    model = Tiny()
    first = trainer(tmp_path, plugin(), epochs=3)
    first.fit(model)
    last = tmp_path / "ckpt" / "last.ckpt"
    assert (last / "manifest.json").is_file() or (last.is_symlink() and (last.resolve() / "manifest.json").is_file())
    kept = [p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("epoch=")]
    if how != "lightning_async":  # there a removal may run before the save it removes (Lightning's own queue)
        assert sorted(kept) == ["epoch=1-step=16.ckpt", "epoch=2-step=24.ckpt"]  # top-2 kept, the older removed

    state = ckptbench.load(last)  # an ordinary ckptbench checkpoint
    assert state["global_step"] == 24 and state["epoch"] == 2
    assert torch.equal(state["state_dict"]["layer.weight"], model.layer.weight.detach())

    resumed_model = Tiny()
    second = trainer(tmp_path, plugin(), epochs=5)
    second.fit(resumed_model, ckpt_path=last)
    assert second.global_step == 40  # went on from step 24, not from 0
    assert second.lr_scheduler_configs[0].scheduler.last_epoch == 5


def test_load_checkpoint_to_a_device_and_remove(tmp_path: Path):
    io = CkptbenchCheckpointIO(async_=True)
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "epoch": 1}, tmp_path / "a.ckpt")
    loaded = io.load_checkpoint(tmp_path / "a.ckpt", map_location="cpu")  # waits for the save in flight
    assert loaded["epoch"] == 1 and torch.equal(loaded["state_dict"]["w"], torch.ones(3))
    io.remove_checkpoint(tmp_path / "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists()
    io.remove_checkpoint(tmp_path / "never-saved.ckpt")  # nothing there: nothing to do
    io.teardown()
    io.close()


def test_an_async_save_error_is_raised_by_the_next_save_or_teardown(tmp_path: Path):
    (tmp_path / "file").write_text("x")
    io = CkptbenchCheckpointIO(async_=True)
    with pytest.raises(ckptbench.errors.UsageError, match="is a file"):  # refused before staging: raised at once
        io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "file")
    io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "ok.ckpt")
    io.teardown()
    assert (tmp_path / "ok.ckpt" / "manifest.json").is_file()


def test_pickled_hyper_parameters_need_the_opt_in(tmp_path: Path):
    checkpoint = {"state_dict": {"w": torch.ones(2)}, "hyper_parameters": {"schedule": complex_schedule}}
    with pytest.raises(ckptbench.errors.UsageError, match="allow_pickle=True"):
        CkptbenchCheckpointIO().save_checkpoint(checkpoint, tmp_path / "a.ckpt")
    io = CkptbenchCheckpointIO(allow_pickle=True)
    io.save_checkpoint(checkpoint, tmp_path / "a.ckpt")
    assert io.load_checkpoint(tmp_path / "a.ckpt")["hyper_parameters"]["schedule"] is complex_schedule
    with pytest.raises(ckptbench.errors.PickleNotAllowedError):
        io.load_checkpoint(tmp_path / "a.ckpt", weights_only=True)


def complex_schedule(step: int) -> float:
    return 0.5**step


def test_the_module_imports_without_lightning_and_says_what_to_install(tmp_path: Path):
    code = ("import sys; sys.modules['lightning'] = None; sys.modules['lightning_fabric'] = None\n"
            "import ckptbench.integrations.lightning as m\n"
            "try:\n    m.CkptbenchCheckpointIO\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.stdout.strip() == ("MissingDependencyError ckptbench.integrations.lightning needs Lightning, which is "
                                   "not installed (pip install lightning)")

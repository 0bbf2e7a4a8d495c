"""CkptbenchCheckpointIO under Lightning's CheckpointIO contract, as training code meets it: what the checkpoint
holds (hyperparameters with torch values, callbacks' and loops' state), resuming through it exactly as through
Lightning's own TorchCheckpointIO, ``save_last="link"``, ``load_from_checkpoint``, Fabric, and the errors
TorchCheckpointIO raises. Skipped where Lightning is not installed."""

from __future__ import annotations

import contextlib
import inspect
import os
from pathlib import Path

import pytest
import torch

import ckptbench

lightning = pytest.importorskip("lightning", reason="Lightning is an optional extra: pip install lightning")
from lightning.fabric import Fabric  # noqa: E402
from lightning.pytorch import LightningModule, Trainer  # noqa: E402
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO  # noqa: E402

from ckptbench.integrations.lightning import CkptbenchCheckpointIO, load_from_checkpoint  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


@pytest.fixture(autouse=True)
def _restore_determinism():
    """Trainer(deterministic=True) turns torch's deterministic algorithms on for the whole process: restored
    after each test, or tests run after these in the same process fill new tensors (no kernel for some dtypes)."""
    enabled, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


class Net(LightningModule):
    def __init__(self, lr: float = 0.05, dtype: torch.dtype = torch.float32, device_hint: torch.device | None = None,
                 width: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.body(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.body(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.7)}

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g))
        return torch.utils.data.DataLoader(data, batch_size=8)

    val_dataloader = train_dataloader


def make_trainer(root: Path, plugin, epochs: int, callbacks: list) -> Trainer:
    return Trainer(max_epochs=epochs, default_root_dir=root, plugins=[plugin] if plugin is not None else None,
                   logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                   callbacks=callbacks, deterministic=True)


def fit_then_resume(root: Path, plugin_factory) -> tuple[Net, Trainer, Trainer]:
    """Two epochs, then a new Trainer resumes from last.ckpt to four; returns the resumed model and trainers."""
    torch.manual_seed(0)
    first = make_trainer(root, plugin_factory(), 2,
                         [ModelCheckpoint(dirpath=root / "ckpt", monitor="val_loss", save_top_k=2, save_last=True),
                          EarlyStopping("val_loss", patience=50)])
    first.fit(Net(dtype=torch.bfloat16, device_hint=torch.device("cpu")))
    torch.manual_seed(1)
    model = Net(dtype=torch.bfloat16, device_hint=torch.device("cpu"))
    second = make_trainer(root, plugin_factory(), 4,
                          [ModelCheckpoint(dirpath=root / "ckpt", monitor="val_loss", save_top_k=2, save_last=True),
                           EarlyStopping("val_loss", patience=50)])
    second.fit(model, ckpt_path="last")
    return model, first, second


def test_a_resumed_fit_ends_exactly_as_one_resumed_through_torch_checkpoint_io(tmp_path: Path):
    ours, first, second = fit_then_resume(tmp_path / "ours", CkptbenchCheckpointIO)
    theirs, their_first, their_second = fit_then_resume(tmp_path / "torch", TorchCheckpointIO)
    assert second.global_step == their_second.global_step == 16
    for key, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    assert second.optimizers[0].state_dict()["param_groups"] == their_second.optimizers[0].state_dict()["param_groups"]
    ours_ckpt, theirs_ckpt = second.checkpoint_callback, their_second.checkpoint_callback
    assert ours_ckpt.best_model_score == theirs_ckpt.best_model_score  # restored from the callbacks' state
    assert Path(ours_ckpt.best_model_path).name == Path(theirs_ckpt.best_model_path).name
    assert second.early_stopping_callback.wait_count == their_second.early_stopping_callback.wait_count
    assert sorted(p.name for p in (tmp_path / "ours" / "ckpt").iterdir()) == sorted(
        p.name for p in (tmp_path / "torch" / "ckpt").iterdir())


def test_the_checkpoint_holds_what_lightning_wrote_with_torch_values_unpickled(tmp_path: Path):
    _, _, second = fit_then_resume(tmp_path, CkptbenchCheckpointIO)
    ours = ckptbench.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)  # nothing pickled
    assert ours["pytorch-lightning_version"] == lightning.__version__
    assert ours["hyper_parameters"]["dtype"] is torch.bfloat16
    assert ours["hyper_parameters"]["device_hint"] == torch.device("cpu")
    assert set(ours) >= {"state_dict", "optimizer_states", "lr_schedulers", "loops", "callbacks", "epoch",
                         "global_step", "hyper_parameters", "hparams_name"}
    assert any(key.startswith("ModelCheckpoint") for key in ours["callbacks"])


def test_load_from_checkpoint_builds_the_module_from_its_saved_hyperparameters(tmp_path: Path):
    torch.manual_seed(0)
    model = Net(lr=0.2, dtype=torch.float16, width=6)
    trainer = make_trainer(tmp_path, CkptbenchCheckpointIO(), 1, [])
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "final.ckpt")
    with pytest.raises(IsADirectoryError):  # Lightning's own reads with torch.load: the documented limit
        Net.load_from_checkpoint(tmp_path / "final.ckpt")
    loaded = load_from_checkpoint(Net, tmp_path / "final.ckpt")
    assert isinstance(loaded, Net)
    assert loaded.hparams.lr == 0.2 and loaded.hparams.dtype is torch.float16 and loaded.hparams.width == 6
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    narrower = load_from_checkpoint(Net, tmp_path / "final.ckpt", map_location="cpu", lr=0.5)
    assert narrower.hparams.lr == 0.5  # keyword arguments replace saved hyperparameters, as Lightning's
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_from_checkpoint(Net, tmp_path / "final.ckpt", width=3)
    with pytest.raises(ckptbench.errors.UsageError, match="LightningModule or LightningDataModule class"):
        load_from_checkpoint(torch.nn.Linear, tmp_path / "final.ckpt")


def test_load_from_checkpoint_is_strict_with_a_lightning_that_has_no_strict_loading(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch):
    """Lightning 2.1 (the lightning extra's floor) has no LightningModule.strict_loading, and its _load_state
    needs ``strict`` given: None is strict there, as Lightning 2.1's own load_from_checkpoint has it."""
    from lightning.pytorch.core import saving

    trainer = make_trainer(tmp_path, CkptbenchCheckpointIO(), 1, [])
    trainer.fit(Net())
    trainer.save_checkpoint(tmp_path / "final.ckpt")
    given: list[bool | None] = []
    real = saving._load_state

    def load_state(cls: type, checkpoint: dict, strict: bool | None = None, **kwargs: object) -> object:
        given.append(strict)
        return real(cls, checkpoint, strict=strict, **kwargs)

    monkeypatch.setattr(saving, "_load_state", load_state)
    monkeypatch.delattr(LightningModule, "strict_loading")
    assert isinstance(load_from_checkpoint(Net, tmp_path / "final.ckpt"), Net)
    assert given == [True]


def test_save_last_link_is_a_symlink_to_a_checkpoint_directory_and_resumes(tmp_path: Path):
    if "link" not in str(inspect.signature(ModelCheckpoint).parameters["save_last"].annotation):
        pytest.skip("this Lightning has no save_last='link' (Lightning 2.1; it came with 2.2)")

    def callbacks():
        return [ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last="link", monitor="step", mode="max",
                                save_top_k=1)]

    make_trainer(tmp_path, CkptbenchCheckpointIO(), 2, callbacks()).fit(Net())
    last = tmp_path / "ckpt" / "last.ckpt"
    assert last.is_symlink() and (last.resolve() / "manifest.json").is_file()
    second = make_trainer(tmp_path, CkptbenchCheckpointIO(), 3, callbacks())
    second.fit(Net(), ckpt_path="last")
    assert second.global_step == 12
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["epoch=2-step=12.ckpt", "last.ckpt"]
    assert last.is_symlink() and ckptbench.load(last)["global_step"] == 12


def test_a_weights_only_checkpoint_validates_and_holds_no_optimizer(tmp_path: Path):
    trainer = make_trainer(tmp_path, CkptbenchCheckpointIO(), 1, [])
    trainer.fit(Net())
    trainer.save_checkpoint(tmp_path / "weights.ckpt", weights_only=True)
    saved = ckptbench.load(tmp_path / "weights.ckpt")
    assert "optimizer_states" not in saved and "state_dict" in saved
    results = make_trainer(tmp_path, CkptbenchCheckpointIO(), 1, []).validate(Net(), ckpt_path=tmp_path / "weights.ckpt")
    assert results and "val_loss" in results[0]


def test_errors_as_torch_checkpoint_io_raises_them(tmp_path: Path):
    io = CkptbenchCheckpointIO()
    with pytest.raises(FileNotFoundError):  # TorchCheckpointIO's error for a missing checkpoint
        io.load_checkpoint(tmp_path / "missing.ckpt")
    with pytest.raises(FileNotFoundError):
        TorchCheckpointIO().load_checkpoint(tmp_path / "missing.ckpt")
    with pytest.raises(ckptbench.CheckpointNotFoundError, match="nothing at that path"):
        io.load_checkpoint(tmp_path / "missing.ckpt")
    with pytest.raises(ckptbench.errors.UsageError, match="storage_options must be a dict"):
        io.save_checkpoint({"w": torch.ones(1)}, tmp_path / "a.ckpt", storage_options="s3-profile")
    assert not (tmp_path / "a.ckpt").exists()
    (tmp_path / "notes.ckpt").write_text("mine")
    io.remove_checkpoint(tmp_path / "notes.ckpt")  # not a checkpoint directory: left alone
    assert (tmp_path / "notes.ckpt").read_text() == "mine"


def test_map_location_of_load_checkpoint_takes_torch_forms(tmp_path: Path):
    io = CkptbenchCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.arange(3.0)}, "epoch": 2}, tmp_path / "a.ckpt")
    seen = []
    loaded = io.load_checkpoint(tmp_path / "a.ckpt", map_location=lambda s, loc: seen.append(loc) or s)
    assert seen == ["cpu"] and torch.equal(loaded["state_dict"]["w"], torch.arange(3.0))
    assert io.load_checkpoint(tmp_path / "a.ckpt", map_location={"cuda:0": "cpu"})["epoch"] == 2
    meta = io.load_checkpoint(tmp_path / "a.ckpt", map_location={"cpu": "meta"})
    assert meta["state_dict"]["w"].device.type == "meta"


def test_lightning_async_wrapper_raises_a_failed_save_at_teardown(tmp_path: Path):
    (tmp_path / "file.ckpt").write_text("x")
    io = AsyncCheckpointIO(CkptbenchCheckpointIO())
    # Fails on Lightning's thread; raised here too where that thread was done already, and by teardown.
    with contextlib.suppress(ckptbench.errors.UsageError):
        io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "file.ckpt")
    with pytest.raises(ckptbench.errors.UsageError, match="is a file"):
        io.teardown()


def test_fabric_saves_and_loads_through_the_plugin(tmp_path: Path):
    fabric = Fabric(accelerator="cpu", devices=1, plugins=[CkptbenchCheckpointIO()])
    torch.manual_seed(0)
    model, optimizer = fabric.setup(torch.nn.Linear(4, 2), torch.optim.Adam(torch.nn.Linear(4, 2).parameters()))
    optimizer = fabric.setup_optimizers(torch.optim.Adam(model.parameters(), lr=0.01))
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    fabric.save(tmp_path / "fabric.ckpt", {"model": model, "optimizer": optimizer, "step": 5,
                                           "dtype": torch.bfloat16})
    assert (tmp_path / "fabric.ckpt" / "manifest.json").is_file()
    new_model = fabric.setup(torch.nn.Linear(4, 2))
    new_optimizer = fabric.setup_optimizers(torch.optim.Adam(new_model.parameters(), lr=0.5))
    state = {"model": new_model, "optimizer": new_optimizer, "step": 0}
    remainder = fabric.load(tmp_path / "fabric.ckpt", state)
    assert remainder == {"dtype": torch.bfloat16} and state["step"] == 5
    assert torch.equal(new_model.weight, model.weight)
    assert new_optimizer.param_groups[0]["lr"] == 0.01
    assert torch.equal(new_optimizer.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])


def test_the_plugin_pickles_and_copies_with_its_settings(tmp_path: Path):
    import copy
    import pickle

    io = CkptbenchCheckpointIO(async_=True, allow_pickle=True, threads=2, checksum=False)
    io.save_checkpoint({"w": torch.ones(4)}, tmp_path / "a.ckpt")  # a save in flight stays the original's
    for twin in (pickle.loads(pickle.dumps(io)), copy.deepcopy(io)):
        assert type(twin) is type(io) and twin.async_ and twin.allow_pickle
        assert twin._checkpointer is not io._checkpointer and twin._checkpointer.threads == 2
        assert twin._checkpointer.checksum is False
        twin.save_checkpoint({"w": torch.zeros(4)}, tmp_path / "b.ckpt")
        assert torch.equal(twin.load_checkpoint(tmp_path / "b.ckpt")["w"], torch.zeros(4))
        twin.teardown()
    io.teardown()
    assert torch.equal(io.load_checkpoint(tmp_path / "a.ckpt")["w"], torch.ones(4))


class Spawned(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=2)


@pytest.mark.slow
def test_ddp_spawn_carries_the_plugin_into_each_process(tmp_path: Path):
    """ddp_spawn pickles the Trainer, its plugins included, into every process it starts."""
    trainer = Trainer(max_epochs=2, default_root_dir=tmp_path, plugins=[CkptbenchCheckpointIO()], strategy="ddp_spawn",
                      accelerator="cpu", devices=2, logger=False, enable_progress_bar=False,
                      enable_model_summary=False,
                      callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=1, monitor="step", mode="max")])
    trainer.fit(Spawned())
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["epoch=1-step=4.ckpt"]
    assert ckptbench.load(tmp_path / "ckpt" / "epoch=1-step=4.ckpt")["global_step"] == 4


def test_a_value_ckptbench_does_not_store_names_the_plugins_opt_in(tmp_path: Path):
    checkpoint = {"state_dict": {"w": torch.ones(2)}, "hyper_parameters": {"activation": torch.nn.GELU()}}
    with pytest.raises(ckptbench.errors.UsageError) as refused:
        CkptbenchCheckpointIO().save_checkpoint(checkpoint, tmp_path / "a.ckpt")
    message = str(refused.value)
    assert message.startswith("hyper_parameters.activation: value of type GELU cannot be saved")
    assert "CkptbenchCheckpointIO(allow_pickle=True)" in message and "\n" not in message
    assert not (tmp_path / "a.ckpt").exists()
    CkptbenchCheckpointIO(allow_pickle=True).save_checkpoint(checkpoint, tmp_path / "a.ckpt")
    loaded = CkptbenchCheckpointIO(allow_pickle=True).load_checkpoint(tmp_path / "a.ckpt")
    assert isinstance(loaded["hyper_parameters"]["activation"], torch.nn.GELU)
    with pytest.raises(ckptbench.PickleNotAllowedError, match=r"hyper_parameters\.activation.*"
                       r"CkptbenchCheckpointIO\(allow_pickle=True\) unpickles them"):
        CkptbenchCheckpointIO().load_checkpoint(tmp_path / "a.ckpt")


def test_removing_a_link_to_a_checkpoint_removes_the_link_only(tmp_path: Path):
    """ModelCheckpoint(save_last="link") removes its previous last link through remove_checkpoint when the
    last name changes (a formatted CHECKPOINT_NAME_LAST): the checkpoint it points to, often a top-k one, stays."""
    io = CkptbenchCheckpointIO()
    io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "epoch=1-step=8.ckpt")
    (tmp_path / "last-epoch=1.ckpt").symlink_to("epoch=1-step=8.ckpt")
    io.remove_checkpoint(tmp_path / "last-epoch=1.ckpt")
    assert not (tmp_path / "last-epoch=1.ckpt").is_symlink()
    assert torch.equal(io.load_checkpoint(tmp_path / "epoch=1-step=8.ckpt")["w"], torch.ones(2))


@pytest.mark.parametrize("form", ["trailing slash", "file URL"])
def test_removing_a_link_named_in_another_form_removes_the_link_only(tmp_path: Path, form: str):
    """A link given as ``link/`` or ``file:///.../link`` is still the link, not the checkpoint it points to."""
    io = CkptbenchCheckpointIO()
    io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "epoch=1-step=8.ckpt")
    link = tmp_path / "last.ckpt"
    link.symlink_to("epoch=1-step=8.ckpt")
    io.remove_checkpoint(f"{link}/" if form == "trailing slash" else f"file://{link}")
    assert not link.is_symlink()
    assert torch.equal(io.load_checkpoint(tmp_path / "epoch=1-step=8.ckpt")["w"], torch.ones(2))


def test_save_last_link_with_a_changing_last_name_keeps_every_checkpoint(tmp_path: Path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last="link", save_top_k=-1)
    checkpoint.CHECKPOINT_NAME_LAST = "last-{epoch}"  # each epoch's last link replaces the one before
    make_trainer(tmp_path, CkptbenchCheckpointIO(), 3, [checkpoint]).fit(Spawned())
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt", "epoch=2-step=12.ckpt", "last-epoch=2.ckpt"]
    for name, step in zip(names, (4, 8, 12, 12), strict=True):  # save_top_k=-1 keeps them all, whole
        assert ckptbench.load(tmp_path / "ckpt" / name)["global_step"] == step, name


def test_a_run_that_switches_to_this_plugin_resumes_from_what_torch_checkpoint_io_wrote(tmp_path: Path):
    """Begun with Lightning's own TorchCheckpointIO, resumed with this plugin from its last.ckpt (a torch.save
    file): the fit goes on from that step and ends bit for bit as one resumed through TorchCheckpointIO; the
    last.ckpt it saves again replaces the file, and top-k removes the torch.save files it drops."""
    plugins = iter([None, CkptbenchCheckpointIO()])
    ours, _, our_second = fit_then_resume(tmp_path / "switched", lambda: next(plugins))
    theirs, _, their_second = fit_then_resume(tmp_path / "torch", TorchCheckpointIO)
    assert our_second.global_step == their_second.global_step == 16
    for name, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], value), name
    ckpt = tmp_path / "switched" / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(p.name for p in (tmp_path / "torch" / "ckpt").iterdir())
    assert ckptbench.load(ckpt / "last.ckpt")["global_step"] == 16
    for path in ckpt.iterdir():  # every checkpoint the resumed fit kept was saved by it, through this plugin
        assert (path / "manifest.json").is_file(), path.name


def test_a_torch_save_file_loads_without_pickle_unless_allowed(tmp_path: Path):
    """A .ckpt TorchCheckpointIO wrote is read by torch.load with weights_only=True (or through a link to it,
    save_last="link"'s); a value that needs unpickling only with allow_pickle=True, never with weights_only."""
    path = tmp_path / "epoch=0-step=4.ckpt"
    torch.save({"state_dict": {"w": torch.arange(3.0)}, "global_step": 4, "dtype": torch.bfloat16}, path)
    (tmp_path / "last.ckpt").symlink_to(path.name)
    for name in (path.name, "last.ckpt"):
        loaded = CkptbenchCheckpointIO().load_checkpoint(tmp_path / name)
        assert torch.equal(loaded["state_dict"]["w"], torch.arange(3.0)) and loaded["global_step"] == 4
        assert loaded["dtype"] is torch.bfloat16
    pickled = tmp_path / "pickled.ckpt"
    torch.save({"state_dict": {}, "fn": os.getcwd}, pickled)
    with pytest.raises(ckptbench.PickleNotAllowedError, match="allow_pickle=True"):
        CkptbenchCheckpointIO().load_checkpoint(pickled)
    with pytest.raises(ckptbench.PickleNotAllowedError):
        CkptbenchCheckpointIO(allow_pickle=True).load_checkpoint(pickled, weights_only=True)
    assert CkptbenchCheckpointIO(allow_pickle=True).load_checkpoint(pickled)["fn"] is os.getcwd


def test_removing_a_torch_save_file_removes_it_and_a_fifo_stays(tmp_path: Path):
    """A run that switched to this plugin still has ModelCheckpoint tracking .ckpt files TorchCheckpointIO wrote:
    removing one removes the file, as TorchCheckpointIO would. A FIFO there is neither: left alone (and any other
    file: see test_errors_as_torch_checkpoint_io_raises_them)."""
    old = tmp_path / "epoch=0-step=4.ckpt"
    torch.save({"w": torch.ones(2)}, old)
    io = CkptbenchCheckpointIO()
    io.remove_checkpoint(old)
    assert not old.exists()
    fifo = tmp_path / "fifo.ckpt"
    os.mkfifo(fifo)
    io.remove_checkpoint(fifo)
    assert fifo.exists()
    io.remove_checkpoint(tmp_path / "never-saved.ckpt")  # nothing there: nothing to do, as TorchCheckpointIO


def test_on_object_storage_top_k_removal_and_resume_match_torch_checkpoint_io():
    """default_root_dir and dirpath on storage reached by URL (memory://, an fsspec filesystem with directories):
    Lightning lists and checks names through fsspec, the plugin saves, loads and removes through its store.
    The same fit resumed from last.ckpt ends bit for bit as through TorchCheckpointIO, and the same
    checkpoints remain: a removed one leaves no empty directory that Lightning would take for a checkpoint
    (it named the next save of that name "-v1")."""
    import uuid

    import fsspec

    def run(root: str, plugin_factory) -> tuple[Net, Trainer]:
        def callbacks() -> list:
            return [ModelCheckpoint(dirpath=f"{root}/ckpt", monitor="val_loss", save_top_k=2, save_last=True,
                                    every_n_epochs=1)]

        torch.manual_seed(0)
        make_trainer(root, plugin_factory(), 3, callbacks()).fit(Net())
        torch.manual_seed(1)
        model = Net()
        second = make_trainer(root, plugin_factory(), 5, callbacks())
        second.fit(model, ckpt_path=f"{root}/ckpt/last.ckpt")  # ("last" finds nothing under a URL)
        return model, second

    base = f"memory://lightning-{uuid.uuid4().hex[:8]}"
    ours, our_trainer = run(f"{base}/ours", CkptbenchCheckpointIO)
    theirs, their_trainer = run(f"{base}/torch", TorchCheckpointIO)
    assert our_trainer.global_step == their_trainer.global_step == 20
    for key, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    fs = fsspec.filesystem("memory")
    names = {side: sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(f"{base}/{side}/ckpt", detail=False))
             for side in ("ours", "torch")}
    assert names["ours"] == names["torch"] and len(names["ours"]) == 3, names  # top 2 + last
    assert ckptbench.load(f"{base}/ours/ckpt/last.ckpt")["global_step"] == 20
    fs.rm(base, recursive=True)

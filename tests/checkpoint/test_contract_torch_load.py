"""``ckptbench.save``/``load`` as drop-ins for ``torch.save``/``torch.load`` on state_dicts: torch's keywords
(``map_location``, ``weights_only``, ``mmap``) mean what they mean there, or the documented safe thing;
what ckptbench cannot take (a file object) is one clear error; the values a training state holds come back."""

from __future__ import annotations

import collections
import io
import json
from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench.checkpoint import Checkpointer
from ckptbench.errors import CorruptCheckpointError, PickleNotAllowedError, UsageError


@pytest.fixture
def saved(tmp_path: Path) -> tuple[dict, Path]:
    w = torch.nn.Parameter(torch.randn(5, 3))
    state = {"w": w, "tied": w, "b": torch.arange(4.0), "step": 3, "empty": torch.empty(0)}
    ckptbench.save(state, tmp_path / "c")
    return state, tmp_path / "c"


@pytest.mark.parametrize("where", ["cpu", torch.device("cpu"), {"cuda:0": "cpu"}, {"cpu": "cpu"}, None])
def test_map_location_as_a_device_or_a_dict_loads_to_the_cpu(saved, where):
    state, path = saved
    loaded = ckptbench.load(path, map_location=where)
    assert loaded["w"].device.type == "cpu" and torch.equal(loaded["w"], state["w"])
    assert loaded["tied"] is loaded["w"]


def test_map_location_is_the_second_positional_argument_as_in_torch_load(saved):
    state, path = saved
    assert torch.equal(ckptbench.load(path, "cpu")["b"], state["b"])
    assert torch.equal(Checkpointer().load(path, torch.device("cpu"))["b"], state["b"])


def test_a_dict_maps_the_cpu_location_every_tensor_is_read_to(saved):
    _, path = saved
    loaded = ckptbench.load(path, map_location={"cpu": "meta", "cuda:1": "cpu"})
    assert {t.device.type for t in (loaded["w"], loaded["b"], loaded["empty"])} == {"meta"}
    assert loaded["w"].shape == (5, 3)


def test_a_map_location_function_is_called_as_torch_calls_it(saved):
    state, path = saved
    calls = []

    def to_copies(storage, location):
        calls.append((type(storage), location))
        return storage.clone()

    loaded = ckptbench.load(path, map_location=to_copies)
    assert calls and set(calls) == {(torch.UntypedStorage, "cpu")}
    assert len(calls) == 3  # once per storage: the tied pair shares one
    assert isinstance(loaded["w"], torch.nn.Parameter) and loaded["tied"] is loaded["w"]
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"])
    assert loaded["empty"].shape == (0,)
    assert ckptbench.load(path, map_location=lambda storage, location: None)["b"].device.type == "cpu"


def test_a_map_location_function_returning_no_storage_is_refused(saved):
    _, path = saved
    with pytest.raises(UsageError, match="map_location returned int"):
        ckptbench.load(path, map_location=lambda storage, location: 3)


@pytest.mark.parametrize("where", [3.5, "gpu-of-mine", object()])
def test_a_map_location_that_is_no_device_is_one_usage_error(saved, where):
    _, path = saved
    with pytest.raises(UsageError, match="map_location .* is not a device"):
        ckptbench.load(path, map_location=where)


def test_map_location_and_device_together_are_refused(saved):
    _, path = saved
    with pytest.raises(UsageError, match="both given"):
        ckptbench.load(path, map_location="cpu", device="cpu")


def test_weights_only_and_mmap_are_accepted(saved):
    state, path = saved
    for kwargs in ({"weights_only": True}, {"weights_only": False}, {"mmap": True}, {"mmap": False},
                   {"weights_only": True, "mmap": True, "map_location": "cpu"}):
        loaded = ckptbench.load(path, **kwargs)
        assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 3, kwargs


def test_weights_only_never_unpickles_and_false_alone_does_not_either(tmp_path: Path):
    ckptbench.save({"w": torch.ones(2), "fn": print}, tmp_path / "c", allow_pickle=True)
    with pytest.raises(PickleNotAllowedError, match="weights_only=False alone does not unpickle") as refused:
        ckptbench.load(tmp_path / "c", weights_only=False)
    assert "\n" not in str(refused.value) and "allow_pickle=True" in str(refused.value)
    with pytest.raises(PickleNotAllowedError, match="without weights_only=True"):
        ckptbench.load(tmp_path / "c", weights_only=True, allow_pickle=True)
    assert ckptbench.load(tmp_path / "c", weights_only=False, allow_pickle=True)["fn"] is print


@pytest.mark.parametrize("kwargs", [{"weights_only": "yes"}, {"mmap": 1.0}])
def test_weights_only_and_mmap_take_booleans(saved, kwargs):
    _, path = saved
    with pytest.raises(UsageError, match="must be True, False or None"):
        ckptbench.load(path, **kwargs)


@pytest.mark.parametrize("target", [io.BytesIO(), io.StringIO()])
def test_file_objects_are_one_clear_error(tmp_path: Path, target):
    for call in (lambda: ckptbench.save({"w": torch.ones(1)}, target),
                 lambda: ckptbench.save({"w": torch.ones(1)}, target, threads=1),
                 lambda: ckptbench.load(target),
                 lambda: Checkpointer().load(target)):
        with pytest.raises(UsageError, match="file object .* never one file or stream") as refused:
            call()
        assert "\n" not in str(refused.value) and "torch.save" in str(refused.value)


def test_a_torch_save_file_is_refused_saying_what_reads_it(tmp_path: Path):
    torch.save({"w": torch.ones(1)}, tmp_path / "model.pt")
    with pytest.raises(ckptbench.NotACheckpointError, match="torch.load"):
        ckptbench.load(tmp_path / "model.pt")


def test_torch_dtypes_devices_and_complex_numbers_round_trip(tmp_path: Path):
    state = {"dtype": torch.bfloat16, "device": torch.device("cuda", 1), "cpu": torch.device("cpu"),
             "z": complex(1.5, -2.0), "nan": complex(float("nan"), float("inf")),
             "by_dtype": {torch.float16: 2, torch.float32: 4}, "mixed": [torch.int8, (torch.device("meta"), 1j)],
             "w": torch.ones(2)}
    ckptbench.save(state, tmp_path / "c")
    loaded = ckptbench.load(tmp_path / "c")
    assert loaded["dtype"] is torch.bfloat16
    assert loaded["device"] == torch.device("cuda", 1) and loaded["cpu"] == torch.device("cpu")
    assert loaded["z"] == complex(1.5, -2.0)
    assert repr(loaded["nan"]) == repr(complex(float("nan"), float("inf")))
    assert loaded["by_dtype"] == {torch.float16: 2, torch.float32: 4}
    assert loaded["mixed"] == [torch.int8, (torch.device("meta"), 1j)]
    buffer = io.BytesIO()  # the same values torch.load(weights_only=True) accepts
    torch.save(state, buffer)
    buffer.seek(0)
    reference = torch.load(buffer, weights_only=True)
    assert {k: v for k, v in loaded.items() if k not in ("w", "nan")} == {
        k: v for k, v in reference.items() if k not in ("w", "nan")}


def test_a_counter_keeps_its_type_as_torch_load_keeps_it(tmp_path: Path):
    counts = collections.Counter({"the": 3, ("a", 1): 2})
    ckptbench.save({"vocab": counts, "plain": {"x": 1}}, tmp_path / "c")
    loaded = ckptbench.load(tmp_path / "c")
    assert type(loaded["vocab"]) is collections.Counter and loaded["vocab"] == counts
    assert loaded["vocab"]["missing"] == 0
    assert type(loaded["plain"]) is dict


@pytest.mark.parametrize("tag", [{"__dtype__": "tensor"}, {"__dtype__": "float99"}, {"__device__": "warp9"},
                                 {"__device__": "cuda:99999999999999999999999"}])
def test_a_dtype_or_device_this_torch_does_not_have_is_a_corrupt_checkpoint(tmp_path: Path, tag: dict):
    ckptbench.save({"dtype": torch.float16}, tmp_path / "c")
    path = tmp_path / "c" / "manifest.json"
    manifest = json.loads(path.read_text())
    text = json.dumps(manifest).replace(json.dumps({"__dtype__": "float16"}), json.dumps(tag))
    assert text != json.dumps(manifest)
    path.write_text(text)
    with pytest.raises(CorruptCheckpointError, match="torch d(type|evice)"):
        ckptbench.load(tmp_path / "c")


@pytest.mark.parametrize("tag", [{"__dtype__": "Float 16"}, {"__device__": 3}, {"__complex__": "1+"},
                                 {"__complex__": "(1+2j)", "x": 1}])
def test_malformed_torch_value_tags_are_refused_when_the_manifest_is_read(tmp_path: Path, tag: dict):
    ckptbench.save({"v": complex(1, 2)}, tmp_path / "c")
    path = tmp_path / "c" / "manifest.json"
    text = json.dumps(json.loads(path.read_text()))
    assert json.dumps({"__complex__": "(1+2j)"}) in text
    path.write_text(text.replace(json.dumps({"__complex__": "(1+2j)"}), json.dumps(tag)))
    with pytest.raises(ckptbench.NotACheckpointError, match="cannot be decoded"):
        ckptbench.load(tmp_path / "c")


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    lambda ps: torch.optim.AdamW(ps, lr=0.01, amsgrad=True),
    lambda ps: torch.optim.Adagrad(ps, lr=0.1),
    lambda ps: torch.optim.LBFGS(ps, lr=0.5, history_size=3),
])
def test_an_optimizer_resumed_from_a_checkpoint_steps_as_one_resumed_from_torch_save(tmp_path: Path, make):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    data = torch.randn(16, 4), torch.randn(16, 1)
    optimizer = make(model.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)

    def run(m, opt, sched, steps: int) -> None:
        for _ in range(steps):
            def closure():
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(m(data[0]), data[1])
                loss.backward()
                return loss
            opt.step(closure)
            sched.step()

    run(model, optimizer, scheduler, 3)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    ckptbench.save(state, tmp_path / "c")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    results = []
    for source in ("ckptbench", "torch"):
        if source == "ckptbench":
            loaded = ckptbench.load(tmp_path / "c", weights_only=True)
        else:
            buffer.seek(0)
            loaded = torch.load(buffer, weights_only=True)
        m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        m.load_state_dict(loaded["model"])
        opt = make(m.parameters())
        opt.load_state_dict(loaded["optimizer"])
        sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
        sched.load_state_dict(loaded["scheduler"])
        run(m, opt, sched, 2)
        results.append((m.state_dict(), opt.state_dict()))
    (ours, ours_opt), (theirs, theirs_opt) = results
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert ours_opt["param_groups"] == theirs_opt["param_groups"]
    assert type(ours_opt["state"]) is type(theirs_opt["state"])


def test_a_model_state_dict_keeps_its_type_metadata_and_tied_weights(tmp_path: Path):
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 10))
    model[2].weight = model[0].weight  # tied, as a language model's head and embedding
    ckptbench.save(model.state_dict(), tmp_path / "c")
    loaded = ckptbench.load(tmp_path / "c")
    assert type(loaded) is collections.OrderedDict
    assert loaded._metadata == model.state_dict()._metadata
    assert loaded["0.weight"] is loaded["2.weight"]  # stored once (model.state_dict() detaches each one)
    assert loaded["1.num_batches_tracked"].dtype == torch.int64
    fresh = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 10))
    fresh[2].weight = fresh[0].weight
    fresh.load_state_dict(loaded)
    assert torch.equal(fresh[2].weight, model[0].weight)


def test_views_of_one_storage_load_as_tensors_of_their_own_with_their_values(tmp_path: Path):
    """torch.load keeps views sharing their base's storage and their strides; a ckptbench load gives each
    tensor a contiguous storage of its own (the documented difference), with the same values."""
    base = torch.arange(20.0)
    state = {"base": base, "part": base[2:8], "transposed": base.view(4, 5).t()}
    ckptbench.save(state, tmp_path / "c")
    loaded = ckptbench.load(tmp_path / "c")
    for key in state:
        assert torch.equal(loaded[key], state[key]), key
    loaded["part"].add_(100)
    assert torch.equal(loaded["base"], torch.arange(20.0))
    assert loaded["transposed"].is_contiguous()


@pytest.mark.parametrize("root", [torch.ones(3), [torch.ones(1)], 5, None])
def test_a_root_other_than_a_dict_is_refused_saying_how_to_wrap_it(tmp_path: Path, root):
    with pytest.raises(UsageError, match=r"must be a dict, not .*wrap it: save\(\{'value': obj\}, path\)"):
        ckptbench.save(root, tmp_path / "c")
    assert not (tmp_path / "c").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("where", ["cuda:0", torch.device("cuda", 0), {"cpu": "cuda:0"},
                                   lambda storage, location: storage.cuda(0)])
def test_map_location_to_a_gpu(saved, where):
    state, path = saved
    loaded = ckptbench.load(path, map_location=where)
    assert loaded["w"].device == torch.device("cuda", 0) and loaded["b"].device == torch.device("cuda", 0)
    assert isinstance(loaded["w"], torch.nn.Parameter) and loaded["tied"] is loaded["w"]
    assert torch.equal(loaded["w"].cpu(), state["w"].detach()) and torch.equal(loaded["b"].cpu(), state["b"])

"""Synthetic checkpoint state_dicts with a real model's tensor layout (the ``checkpoint`` workload).

A workload is planned (pure, no torch) from a model preset and a target size, then built once into a
flat ``{name: tensor}`` state_dict, allocated and filled before any timing starts.

What a workload holds, for a Llama-layout model (``ModelShape.tensor_shapes``):

* every weight in **bf16**, with its Hugging Face name (embeddings, q/k/v/o, gate/up/down, norms,
  final norm, lm_head);
* a per-block fp32 buffer ``self_attn.rotary_emb.inv_freq`` (older Hugging Face checkpoints carry
  one per block): many small fp32 tensors;
* **fp32 Adam state** (``exp_avg``, ``exp_avg_sq`` and a 0-dim ``step``) for a trainable subset:
  every norm and the k/v projections of every block (about 12 % of the bytes at scale 1), under
  ``optimizer.state.<param>.*``; one 0-dim tensor and several KiB-sized ones per parameter, so
  the dict has many small tensors beside the big matrices.

Scaling keeps that structure. ``scale`` is a fraction of the full workload's bytes (equivalently of
its parameters): the width shrinks by about ``scale ** (1/3)`` (whole attention heads, the GQA
group and head size kept), the vocabulary so the embeddings keep their share of the bytes, and the
number of blocks makes up the rest. The achieved size is reported; it lands within one block of
the target.

Placing a state_dict on a device for a run (:func:`check_device`, :func:`to_device`) is here too.
The writers that save and load it are in ``bench/writers.py``; the runner (``bench.checkpoint``)
orchestrates both without importing torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

from ckptbench.errors import UsageError
from ckptbench.interrupts import Workers
from ckptbench.model.sizing import ModelShape
from ckptbench.units import format_size

#: Bytes per element of the dtypes a workload uses.
DTYPE_BYTES = {"bf16": 2, "fp32": 4}
#: Tensors smaller than this count as "small" in the workload summary.
SMALL_TENSOR_BYTES = 2**20
#: Projections of every block that carry Adam state (besides every norm).
OPTIMIZER_PROJECTIONS = ("self_attn.k_proj.weight", "self_attn.v_proj.weight")
_FFN_MULTIPLE = 128
_VOCAB_MULTIPLE = 64
_MIN_HEAD_DIM = 16
#: A planned size further than this from the target tries the neighbouring widths too.
_FIT_TOLERANCE = 0.05
_SEED = 0x636B7074


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the workload: its state_dict key, shape and dtype (``bf16`` or ``fp32``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class CheckpointWorkload:
    """A planned synthetic checkpoint: the (scaled) model shape and every tensor of its state_dict.

    ``requested_bytes`` is what ``--scale``/``--size`` asked for, ``full_bytes`` the same composition
    at scale 1; ``scale`` is the achieved fraction ``total_bytes / full_bytes``.
    """

    preset: str
    shape: ModelShape
    requested_bytes: int
    full_bytes: int
    tensors: tuple[TensorSpec, ...]
    #: The option that sized it, for hints (``--size``; preflight's ``--measure-size``).
    size_option: str = "--size"

    @property
    def size_hint(self) -> str:
        """How to make it smaller, in the options of the command that planned it."""
        return "lower --scale or --size" if self.size_option == "--size" else f"lower {self.size_option}"

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def scale(self) -> float:
        return self.total_bytes / self.full_bytes

    def bytes_by_dtype(self) -> dict[str, int]:
        out = dict.fromkeys(DTYPE_BYTES, 0)
        for t in self.tensors:
            out[t.dtype] += t.nbytes
        return out

    def describe(self) -> str:
        """``"llama3-8b x0.100: 9 blocks, hidden 2048, 1.81 GiB in 290 tensors (bf16 88 %, fp32 12 %)"``."""
        by_dtype = self.bytes_by_dtype()
        shares = ", ".join(f"{d} {b / self.total_bytes:.0%}" for d, b in by_dtype.items() if b)
        return (f"{self.preset} x{self.scale:.3f}: {self.shape.layers} blocks, hidden {self.shape.hidden}, "
                f"{format_size(self.total_bytes)} in {len(self.tensors)} tensors" + (f" ({shares})" if shares else ""))

    def to_dict(self) -> dict[str, Any]:
        sizes = sorted(t.nbytes for t in self.tensors)
        return {
            "model": self.preset,
            "scale": self.scale,
            "requested_bytes": self.requested_bytes,
            "full_bytes": self.full_bytes,
            "total_bytes": self.total_bytes,
            "tensors": len(self.tensors),
            "small_tensors": sum(1 for n in sizes if n < SMALL_TENSOR_BYTES),
            "small_tensor_threshold_bytes": SMALL_TENSOR_BYTES,
            "largest_tensor_bytes": sizes[-1] if sizes else 0,  # a rank's shard may hold no tensors
            "smallest_tensor_bytes": sizes[0] if sizes else 0,
            "bytes_by_dtype": self.bytes_by_dtype(),
            "shape": {
                "layers": self.shape.layers, "hidden": self.shape.hidden, "ffn_hidden": self.shape.ffn_hidden,
                "vocab": self.shape.vocab, "heads": self.shape.heads, "kv_heads": self.shape.kv_heads,
                "head_dim": self.shape.head_dim, "tied_embeddings": self.shape.tied_embeddings,
                "params": self.shape.params_from_shape(),
            },
            "composition": "bf16 weights; fp32 rotary inv_freq per block; fp32 Adam exp_avg/exp_avg_sq/step "
                           "for every norm and the k/v projections",
        }


def compose(shape: ModelShape) -> list[TensorSpec]:
    """Every tensor of the workload for ``shape``, in state_dict order (weights, then optimizer state)."""
    tensors: list[TensorSpec] = []
    trainable: list[TensorSpec] = []
    for name, dims in shape.tensor_shapes():
        weight = TensorSpec(name, dims, "bf16")
        tensors.append(weight)
        if name.endswith("norm.weight") or name.endswith(OPTIMIZER_PROJECTIONS):
            trainable.append(weight)
        if name.endswith("post_attention_layernorm.weight"):  # the last tensor of a block
            block = name.removesuffix("post_attention_layernorm.weight")
            tensors.append(TensorSpec(block + "self_attn.rotary_emb.inv_freq", (shape.head_dim // 2,), "fp32"))
    for weight in trainable:
        prefix = f"optimizer.state.{weight.name}."
        tensors += [TensorSpec(prefix + "exp_avg", weight.shape, "fp32"),
                    TensorSpec(prefix + "exp_avg_sq", weight.shape, "fp32"),
                    TensorSpec(prefix + "step", (), "fp32")]
    return tensors


def _bytes(shape: ModelShape) -> int:
    return sum(t.nbytes for t in compose(shape))


def _resize(base: ModelShape, heads: int, head_dim: int, vocab: int, layers: int) -> ModelShape:
    group = base.heads // base.kv_heads
    hidden = heads * head_dim
    ffn = max(_FFN_MULTIPLE, round(base.ffn_hidden * hidden / base.hidden / _FFN_MULTIPLE) * _FFN_MULTIPLE)
    shape = dataclasses.replace(base, layers=layers, hidden=hidden, ffn_hidden=ffn, vocab=vocab, heads=heads,
                                kv_heads=heads // group, params=1.0)
    return dataclasses.replace(shape, params=float(shape.params_from_shape()))


def _fit(base: ModelShape, heads: int, head_dim: int, target: int, embedding_share: float,
         layers: int | None = None) -> ModelShape:
    """``base`` at this width, the vocabulary keeping the embeddings' share, and the block count nearest ``target``."""
    n_embeddings = 1 if base.tied_embeddings else 2
    hidden = heads * head_dim
    vocab = round(embedding_share * target / (n_embeddings * hidden * DTYPE_BYTES["bf16"]) / _VOCAB_MULTIPLE)
    vocab = min(base.vocab, max(1, vocab) * _VOCAB_MULTIPLE)
    if layers is None:
        one = _bytes(_resize(base, heads, head_dim, vocab, 1))
        per_block = _bytes(_resize(base, heads, head_dim, vocab, 2)) - one
        layers = max(1, round((target - (one - per_block)) / per_block))
    return _resize(base, heads, head_dim, vocab, layers)


def plan_workload(shape: ModelShape, *, scale: float | None = None, size_bytes: int | None = None,
                  size_option: str = "--size") -> CheckpointWorkload:
    """Scale ``shape`` so its workload holds about ``scale`` x the full workload's bytes (or ``size_bytes``).

    Give exactly one of ``scale`` (in (0, 1]) or ``size_bytes`` (at most the full workload's bytes).
    ``size_option``: the option that gave the size, named in the hints. Pure: no torch, no allocation.
    """
    if (scale is None) == (size_bytes is None):
        raise UsageError("give a scale or a size, not both and not neither")
    if scale is not None and not 0 < scale <= 1:
        raise UsageError(f"scale {scale!r} must be in (0, 1]")
    if size_bytes is not None and size_bytes <= 0:
        raise UsageError(f"size {size_bytes!r} must be positive")
    full_bytes = _bytes(shape)
    target = round(scale * full_bytes) if scale is not None else int(size_bytes)  # type: ignore[operator]
    fraction = target / full_bytes
    if fraction > 1:
        raise UsageError(f"{format_size(target)} is more than the full {shape.name} workload "
                         f"({format_size(full_bytes)})", hint=f"use a larger model preset or a smaller {size_option}")
    if fraction == 1:
        return CheckpointWorkload(shape.name, shape, target, full_bytes, tuple(compose(shape)), size_option)

    group = shape.heads // shape.kv_heads
    heads = max(group, group * round(shape.heads * fraction ** (1 / 3) / group))
    head_dim = shape.head_dim
    n_embeddings = 1 if shape.tied_embeddings else 2
    embedding_share = n_embeddings * shape.vocab * shape.hidden * DTYPE_BYTES["bf16"] / full_bytes
    # Even one block may overshoot a small target: narrow the model (fewer heads first, then smaller heads).
    while _bytes(_fit(shape, heads, head_dim, target, embedding_share, layers=1)) > target:
        if heads > group:
            heads -= group
        elif head_dim > _MIN_HEAD_DIM:
            head_dim //= 2
        else:
            break
    scaled = _fit(shape, heads, head_dim, target, embedding_share)
    miss = abs(_bytes(scaled) / target - 1)
    if miss > _FIT_TOLERANCE:
        # Block granularity is coarse for small targets: a neighbouring width may land much closer.
        for h in (heads - group, heads + group):
            if group <= h <= shape.heads:
                other = _fit(shape, h, head_dim, target, embedding_share)
                if abs(_bytes(other) / target - 1) < miss / 2:
                    scaled, miss = other, abs(_bytes(other) / target - 1)
    if _bytes(scaled) > 2 * target:
        raise UsageError(f"{format_size(target)} is below the smallest {shape.name} workload "
                         f"({format_size(_bytes(scaled))})", hint=f"use a larger {size_option}" + (" or --scale" if size_option == "--size" else ""))
    return CheckpointWorkload(shape.name, scaled, target, full_bytes, tuple(compose(scaled)), size_option)


def build_state_dict(workload: CheckpointWorkload, seed: int = _SEED) -> dict[str, Any]:
    """Allocate and fill the workload's tensors: a flat ``{name: tensor}`` dict on the CPU.

    Values are random but finite (random bits with the top exponent bit cleared: |x| < 2), different
    for every tensor and reproducible from ``seed``; ``inv_freq`` holds real rotary frequencies and
    ``step`` a step count. Every page is written here, so nothing is first touched inside a timed region.
    """
    import torch

    from ckptbench import native

    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    # Clearing the top exponent bit keeps every value finite (no Inf/NaN patterns) and below 2 in magnitude.
    masks = {"bf16": (torch.int16, 0xBFFF - 0x10000), "fp32": (torch.int32, 0xBFFFFFFF - 0x100000000)}

    def make(index: int, spec: TensorSpec) -> Any:
        tensor = torch.empty(spec.shape, dtype=dtypes[spec.dtype])
        if spec.name.endswith(".inv_freq"):
            dim = 2 * spec.shape[0]
            tensor.copy_(1.0 / (500000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)))
        elif spec.name.endswith(".step"):
            tensor.fill_(1000.0)
        else:
            flat = tensor.reshape(-1)
            native.fill_random(flat.view(torch.uint8).numpy(), seed + index)
            int_dtype, mask = masks[spec.dtype]
            flat.view(int_dtype).bitwise_and_(mask)
        return tensor

    # First-touch page faults dominate filling; tensors are independent, so fill them on every core.
    with Workers(os.cpu_count() or 1, "ckptbench-fill") as pool:  # Ctrl-C safe (ckptbench.interrupts)
        for index, spec in enumerate(workload.tensors):
            pool.submit(make, index, spec)
        tensors = pool.join()
    return {spec.name: tensor for spec, tensor in zip(workload.tensors, tensors, strict=True)}


#: GPU memory a --device cuda run needs, in checkpoints: the state_dict and one loaded copy, plus slack.
DEVICE_COPIES = 2.2


def check_device(device: str, nbytes: int) -> None:
    """UsageError unless ``device`` exists here and has room for the run's copies of the checkpoint."""
    if device == "cpu":
        return
    import torch

    if not torch.cuda.is_available():
        raise UsageError(f"--device {device} needs a CUDA GPU, and torch sees none here "
                         f"(torch {torch.__version__}, torch.cuda.is_available() is False)",
                         hint="drop --device to save a CPU state_dict")
    index = _gpu_index(device)
    if index >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: this machine has {torch.cuda.device_count()} GPU(s), cuda:0 to "
                         f"cuda:{torch.cuda.device_count() - 1}")
    free = device_free_bytes(device)
    need = int(DEVICE_COPIES * nbytes)
    if need > free:
        raise UsageError(f"the run keeps about {DEVICE_COPIES:g} copies of the {format_size(nbytes)} checkpoint on "
                         f"cuda:{index} ({format_size(need)}) but only {format_size(free)} of its memory is free",
                         hint="lower --scale or --size")


def rank_device(local_rank: int, nbytes: int) -> tuple[str, str | None]:
    """(this rank's GPU, None), or ("cpu", why it cannot have one): torch sees no GPU, or too little memory.
    Ranks wrap around the host's GPUs (cuda:LOCAL_RANK mod their count)."""
    import torch

    if not torch.cuda.is_available():
        return "cpu", f"--device cuda: torch sees no GPU on this host (torch {torch.__version__})"
    device = f"cuda:{local_rank % torch.cuda.device_count()}"
    try:
        check_device(device, nbytes)
    except UsageError as exc:
        return "cpu", str(exc)
    return device, None


def gpu_count() -> int:
    """The GPUs torch sees here (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _gpu_index(device: str) -> int:
    """The GPU ``device`` names (cuda: the current one)."""
    import torch

    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def device_free_bytes(device: str) -> int:
    """Free memory of the GPU ``device`` names (cuda: the current one)."""
    import torch

    free, _ = torch.cuda.mem_get_info(_gpu_index(device))
    return int(free)


def to_device(state_dict: dict[str, Any], device: str) -> dict[str, Any]:
    """``state_dict`` moved to ``device`` one tensor at a time (each CPU copy freed as it goes)."""
    if device == "cpu":
        return state_dict
    import torch

    moved = {}
    for key in list(state_dict):
        moved[key] = state_dict.pop(key).to(device)
    torch.cuda.synchronize(device)
    return moved


def state_dict_bytes(state_dict: dict[str, Any]) -> int:
    """Bytes of the tensors of a flat ``{name: tensor}`` state_dict."""
    return sum(t.numel() * t.element_size() for t in state_dict.values())


def fingerprint(state_dict: dict[str, Any]) -> dict[str, int]:
    """The CRC-32C of every tensor's bytes, by key (a GPU tensor's copied to the host one at a time)."""
    import torch

    from ckptbench import native

    return {key: native.crc32c(t.reshape(-1).view(torch.uint8).cpu().numpy()) for key, t in state_dict.items()
            if isinstance(t, torch.Tensor)}


def part_of(state_dict: dict[str, Any], nbytes: int) -> tuple[dict[str, Any], int]:
    """The first ``nbytes`` (about) of ``state_dict``'s contiguous CPU tensors, as flat views of them (the
    last one cut), and their bytes; the state_dict itself when it holds no more."""
    import torch

    total = sum(t.nbytes for t in state_dict.values() if isinstance(t, torch.Tensor))
    if nbytes >= total:
        return state_dict, total
    part: dict[str, Any] = {}
    left = nbytes
    for key, t in state_dict.items():
        if not isinstance(t, torch.Tensor) or left <= 0:
            continue
        flat = t.reshape(-1)
        count = min(flat.numel(), max(1, left // t.element_size()))
        part[key] = flat[:count]
        left -= count * t.element_size()
    return part, sum(t.nbytes for t in part.values())

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

The second half of this module is what the benchmark does *with* a state_dict, kept here because
DESIGN.md confines torch to this module within ``bench/``: the writers under test behind one small
contract (:class:`Writer`: ckptbench, torch.save, torch.distributed.checkpoint, safetensors, and fio
as the raw-bytes reference), bit-exact verification, and the compute probe used to measure
interference. The runner (``bench.checkpoint``) orchestrates them without importing torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptbench.errors import MissingDependencyError, StorageIOError, UsageError
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


def plan_workload(shape: ModelShape, *, scale: float | None = None, size_bytes: int | None = None) -> CheckpointWorkload:
    """Scale ``shape`` so its workload holds about ``scale`` x the full workload's bytes (or ``size_bytes``).

    Give exactly one of ``scale`` (in (0, 1]) or ``size_bytes`` (at most the full workload's bytes).
    Pure: no torch, no allocation.
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
                         f"({format_size(full_bytes)})", hint="use a larger model preset or a smaller --size")
    if fraction == 1:
        return CheckpointWorkload(shape.name, shape, target, full_bytes, tuple(compose(shape)))

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
                         f"({format_size(_bytes(scaled))})", hint="use a larger --size or --scale")
    return CheckpointWorkload(shape.name, scaled, target, full_bytes, tuple(compose(scaled)))


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


# -- what the benchmark does with a state_dict (torch lives here, per DESIGN.md) -------------------


def verify_state_dict(source: dict[str, Any], loaded: dict[str, Any], writer: str) -> None:
    """Raise StorageIOError unless ``loaded`` has the same keys, dtypes, shapes and bytes as ``source``."""
    import torch

    if set(loaded) != set(source):
        missing, extra = sorted(set(source) - set(loaded)), sorted(set(loaded) - set(source))
        raise StorageIOError(f"{writer}: loaded keys differ from the saved ones (missing {missing[:3]}, "
                             f"unexpected {extra[:3]})")
    for key, want in source.items():
        got = loaded[key]
        if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
            raise StorageIOError(f"{writer}: {key!r} loaded as {got.dtype} {tuple(got.shape)}, "
                                 f"saved as {want.dtype} {tuple(want.shape)}")
        if got.device != want.device:
            raise StorageIOError(f"{writer}: {key!r} loaded to {got.device}, saved from {want.device}")
        if not torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)):
            raise StorageIOError(f"{writer}: {key!r} loaded with different bytes than were saved")


def fault_in(state_dict: dict[str, Any]) -> None:
    """Touch one byte of every page of every CPU tensor, so a lazily mapped load (mmap) is really in
    memory; wait for the copies still running into GPU tensors."""
    import torch

    devices = set()
    for tensor in state_dict.values():
        if tensor.is_cuda:
            devices.add(tensor.device)
            continue
        flat = tensor.reshape(-1).view(torch.uint8)
        if flat.numel():
            flat[::4096].sum()
    for device in devices:
        torch.cuda.synchronize(device)


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PendingSave:
    """An asynchronous save in flight: ``done()`` polls, ``wait()`` returns once it is durable."""

    def __init__(self, done: Callable[[], bool], wait: Callable[[], Any]) -> None:
        self.done = done
        self._wait = wait

    def wait(self) -> None:
        self._wait()


class Writer:
    """A checkpoint writer under test, behind one small contract the runner relies on.

    Call order: ``prepare(state_dict)`` once (outside timing); then any number of ``save`` (returns
    the seconds until the checkpoint in ``directory`` was *durable*: fsync of files and directory
    added where the writer does not do them) and ``load`` (the seconds to a state_dict whose every
    page is in memory, and the state_dict, or None where the writer loads raw bytes only);
    ``close()`` last. ``directory`` does not exist before a save. Async writers also offer
    ``save_async``, which returns once the caller may change its tensors.
    """

    name = ""
    durable = ""
    load_how = ""
    #: Where loads put the tensors ("cpu", "cuda", "cuda:N"): the device the saved state_dict lives on.
    device = "cpu"
    supports_async = False
    async_how = ""
    #: Bytes one save moves when they are not the state_dict's (the fio reference); 0 otherwise.
    bytes = 0

    def prepare(self, state_dict: dict[str, Any]) -> None:
        """Called once with the state_dict before anything is timed."""

    def save(self, state_dict: dict[str, Any], directory: Path) -> float:
        start = time.perf_counter()
        self._save(state_dict, directory)
        return time.perf_counter() - start

    def load(self, directory: Path) -> tuple[float, dict[str, Any] | None]:
        start = time.perf_counter()
        state_dict = self._load(directory)
        fault_in(state_dict)
        return time.perf_counter() - start, state_dict

    def save_async(self, state_dict: dict[str, Any], directory: Path) -> PendingSave:
        raise NotImplementedError

    def details(self) -> dict[str, Any]:
        """Writer-specific facts of the last save, for the record."""
        return {}

    def async_details(self) -> dict[str, Any]:
        """The same of the last async save (merged into ``details``)."""
        return {}

    def close(self) -> None:
        """Release what the writer keeps between saves (a staging arena, a thread pool)."""

    def _save(self, state_dict: dict[str, Any], directory: Path) -> None:
        raise NotImplementedError

    def _load(self, directory: Path) -> dict[str, Any]:
        raise NotImplementedError


class CkptbenchWriter(Writer):
    """``ckptbench.checkpoint.Checkpointer``, kept across saves (its arena is reused, as in training)."""

    name = "ckptbench"
    durable = ("by the writer: O_DIRECT (or buffered + fdatasync) per shard, manifest temp + fsync + rename, "
               "directory fsync; on object storage: every upload completed, then the manifest PUT")
    load_how = ("Checkpointer.load (engine reads, O_DIRECT where possible; on object storage ranged parallel GETs; "
                "CRC-32C of every tensor verified)")
    supports_async = True
    async_how = "Checkpointer.save(async_=True): returns after staging into the arena"

    def __init__(self, threads: int | None = None, storage_options: dict[str, Any] | None = None) -> None:
        from ckptbench.checkpoint import Checkpointer

        self._make = lambda: Checkpointer(threads=threads)
        self._ckpt = self._make()
        self._last: Any = None
        self._last_async: Any = None
        #: For object-storage locations (``directory`` is then a URL string).
        self.storage_options = storage_options or None

    def _save(self, state_dict: dict[str, Any], directory: Path) -> None:
        self._last = self._ckpt.save(state_dict, directory, storage_options=self.storage_options)

    def _load(self, directory: Path) -> dict[str, Any]:
        return self._ckpt.load(directory, device=self.device, storage_options=self.storage_options)

    def save_async(self, state_dict: dict[str, Any], directory: Path) -> PendingSave:
        handle = self._ckpt.save(state_dict, directory, async_=True, storage_options=self.storage_options)

        def wait() -> None:
            self._last_async = handle.result()

        return PendingSave(handle.done, wait)

    def details(self) -> dict[str, Any]:
        last = self._last
        if last is None:
            return {}
        return {"threads": last.threads, "shard_size_bytes": last.shard_size, "block_size_bytes": last.block_size,
                "direct_requested": self._ckpt.direct, "direct": last.direct, "sync": last.sync,
                "checksum": last.checksum, "direct_fallback_reason": last.direct_fallback_reason,
                "plan_reused": last.plan_reused}

    def async_details(self) -> dict[str, Any]:
        """How async saves staged: copy-on-write, or a copy and why."""
        from ckptbench.checkpoint.stage import cow_unavailable

        last = self._last_async
        if last is None:
            return {}
        return {"async_staging": last.staging, "async_cow_faults": last.cow_faults,
                "async_cow_unavailable": cow_unavailable() or None}

    def fresh(self) -> Any:
        """A new Checkpointer with the same settings (an empty arena), for memory measurements."""
        return self._make()

    def close(self) -> None:
        self._ckpt.close()


class TorchWriter(Writer):
    name = "torch"
    durable = "torch.save to one file, then fsync of the file and the directory (added)"
    load_how = "torch.load(map_location='cpu', weights_only=True)"
    FILE = "checkpoint.pt"

    def _save(self, state_dict: dict[str, Any], directory: Path) -> None:
        import torch

        directory.mkdir()
        torch.save(state_dict, directory / self.FILE)
        _fsync_path(directory / self.FILE)
        _fsync_path(directory, directory=True)

    def _load(self, directory: Path) -> dict[str, Any]:
        import torch

        return torch.load(directory / self.FILE, map_location=self.device, weights_only=True)


class DcpWriter(Writer):
    """torch.distributed.checkpoint in one process (``no_dist``), as the goals specify it."""

    name = "dcp"
    THREADS = 4
    durable = (f"dcp.save(FileSystemWriter(thread_count={THREADS}, sync_files=True)) fsyncs every file; "
               "directory fsync added")
    load_how = "dcp.load into freshly allocated tensors (allocation timed)"
    supports_async = True
    async_how = "dcp.async_save (thread executor): returns after staging a CPU copy; directory fsync added"

    def __init__(self) -> None:
        # dcp warns on every call without a process group; a single-process save is what is meant here.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        self._template: list[tuple[str, tuple[int, ...], Any]] = []

    def prepare(self, state_dict: dict[str, Any]) -> None:
        self._template = [(k, tuple(v.shape), v.dtype) for k, v in state_dict.items()]

    def _writer(self, directory: Path) -> Any:
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(directory, thread_count=self.THREADS, sync_files=True)

    def _save(self, state_dict: dict[str, Any], directory: Path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(state_dict, storage_writer=self._writer(directory), no_dist=True)
        _fsync_path(directory, directory=True)

    def save_async(self, state_dict: dict[str, Any], directory: Path) -> PendingSave:
        import torch.distributed.checkpoint as dcp

        response = dcp.async_save(state_dict, storage_writer=self._writer(directory), no_dist=True)
        future = getattr(response, "upload_completion", response)

        def wait() -> None:
            future.result()
            _fsync_path(directory, directory=True)

        return PendingSave(future.done, wait)

    def _load(self, directory: Path) -> dict[str, Any]:
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader

        state_dict = {k: torch.empty(shape, dtype=dtype, device=self.device) for k, shape, dtype in self._template}
        dcp.load(state_dict, storage_reader=FileSystemReader(directory), no_dist=True)
        return state_dict


class SafetensorsWriter(Writer):
    name = "safetensors"
    durable = "safetensors.torch.save_file to one file, then fsync of the file and the directory (added)"
    load_how = "safetensors.torch.load_file (mmap; every page faulted in inside the timed region)"
    FILE = "model.safetensors"

    def __init__(self) -> None:
        try:
            import safetensors.torch  # noqa: F401
        except ImportError:
            raise MissingDependencyError("the safetensors writer needs the safetensors package",
                                         hint="pip install safetensors") from None

    def _save(self, state_dict: dict[str, Any], directory: Path) -> None:
        from safetensors.torch import save_file

        directory.mkdir()
        save_file(state_dict, directory / self.FILE)
        _fsync_path(directory / self.FILE)
        _fsync_path(directory, directory=True)

    def _load(self, directory: Path) -> dict[str, Any]:
        from safetensors.torch import load_file

        return load_file(directory / self.FILE, device=self.device)


class FioReference(Writer):
    """fio moving the same number of bytes: O_DIRECT writes with an fsync per file, then O_DIRECT reads.

    Not a checkpoint writer: the reference for what the device gives (no serialization, no state_dict).
    Times are fio's own (``runtime`` of the group, max over jobs), as in tests/perf/fio_compare.py.
    """

    name = "fio"
    durable = "fio --direct=1 --end_fsync=1 --fallocate=none (raw bytes, no state_dict)"
    load_how = "fio --direct=1 read of the same files"

    def __init__(self, jobs: int, block_size: int) -> None:
        if shutil.which("fio") is None:
            raise MissingDependencyError("the fio reference needs the fio program", hint="apt-get install fio")
        self.jobs = jobs
        self.block_size = block_size
        self._job_bytes = 0
        self.bytes = 0

    def prepare(self, state_dict: dict[str, Any]) -> None:
        total = sum(t.numel() * t.element_size() for t in state_dict.values())
        self._job_bytes = -(-total // self.jobs // 2**20) * 2**20  # whole MiB per job, O_DIRECT-aligned
        self.bytes = self._job_bytes * self.jobs

    def _run(self, directory: Path, rw: str) -> float:
        cmd = ["fio", "--output-format=json", "--group_reporting", f"--directory={directory}", "--ioengine=psync",
               "--direct=1", f"--bs={self.block_size}", f"--numjobs={self.jobs}", f"--size={self._job_bytes}",
               "--fallocate=none", "--name=ckptbench-ref", f"--rw={rw}", *(["--end_fsync=1"] if rw == "write" else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise StorageIOError(f"fio failed in {directory}: {proc.stderr.strip()[-300:]}")
        job = json.loads(proc.stdout)["jobs"][0][rw]
        return job["runtime"] / 1e3  # ms, the group's (max over jobs)

    def save(self, state_dict: dict[str, Any], directory: Path) -> float:
        directory.mkdir()
        return self._run(directory, "write")

    def load(self, directory: Path) -> tuple[float, dict[str, Any] | None]:
        return self._run(directory, "read"), None

    def details(self) -> dict[str, Any]:
        return {"jobs": self.jobs, "block_size_bytes": self.block_size, "bytes": self.bytes}


class ComputeProbe:
    """A fixed matmul loop standing in for training compute; its step time measures interference.

    One step is ``inner`` products of two ``size`` x ``size`` fp32 matrices on ``device``, ``inner``
    chosen once so a step takes about ``step_s`` alone. On a GPU (``--device cuda``, as in training)
    the matrices are larger and each step waits for its products: the persist then competes for the
    host thread that launches them (the GIL, CPU time), not for the GPU itself.
    """

    def __init__(self, size: int | None = None, step_s: float = 0.005, device: str = "cpu") -> None:
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        size = size or (2048 if self.cuda else 256)
        generator = torch.Generator(device=self.device).manual_seed(0)
        self.size = size
        self._a = torch.randn(size, size, generator=generator, device=self.device)
        self._b = torch.randn(size, size, generator=generator, device=self.device)
        self._out = torch.empty(size, size, device=self.device)
        self.inner = 1
        self.step()  # warm the kernels
        once = min(self.step() for _ in range(5))
        self.inner = max(1, round(step_s / max(once, 1e-6)))

    def step(self) -> float:
        import torch

        start = time.perf_counter()
        for _ in range(self.inner):
            torch.mm(self._a, self._b, out=self._out)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def run_for(self, seconds: float) -> list[float]:
        """Step times of back-to-back steps for about ``seconds``."""
        steps, deadline = [], time.perf_counter() + seconds
        while time.perf_counter() < deadline or not steps:
            steps.append(self.step())
        return steps

    def run_while(self, busy: Callable[[], bool]) -> list[float]:
        """Step times of steps that started while ``busy()`` held."""
        steps = []
        while busy():
            steps.append(self.step())
        return steps

    def describe(self) -> dict[str, Any]:
        return {"kind": "torch.mm fp32", "device": str(self.device), "matrix": [self.size, self.size],
                "products_per_step": self.inner, "torch_threads": _torch_threads()}


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


WRITERS = ("ckptbench", "torch", "dcp", "safetensors", "fio")


#: Writers that also save to object storage (the others write local files).
OBJECT_WRITERS = ("ckptbench",)


def make_writer(name: str, *, threads: int | None = None, block_size: int | None = None,
                storage_options: dict[str, Any] | None = None, device: str = "cpu") -> Writer:
    """The adapter for writer ``name`` (one of :data:`WRITERS`); MissingDependencyError if it cannot run here.
    ``storage_options`` reach writers that save to object storage (ckptbench); loads go to ``device``."""
    from ckptbench import knobs

    writer: Writer
    if name == "ckptbench":
        writer = CkptbenchWriter(threads, storage_options)
    elif name == "torch":
        writer = TorchWriter()
    elif name == "dcp":
        writer = DcpWriter()
    elif name == "safetensors":
        writer = SafetensorsWriter()
    elif name == "fio":
        writer = FioReference(threads or knobs.SAVE_THREADS, block_size or knobs.SAVE_BLOCK_BYTES)
    else:
        raise UsageError(f"unknown writer {name!r}", hint=f"known: {', '.join(WRITERS)}")
    writer.device = device
    return writer


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
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    if index >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: this machine has {torch.cuda.device_count()} GPU(s), cuda:0 to "
                         f"cuda:{torch.cuda.device_count() - 1}")
    free, _ = torch.cuda.mem_get_info(index)
    need = int(DEVICE_COPIES * nbytes)
    if need > free:
        raise UsageError(f"the run keeps about {DEVICE_COPIES:g} copies of the {format_size(nbytes)} checkpoint on "
                         f"cuda:{index} ({format_size(need)}) but only {format_size(free)} of its memory is free",
                         hint="lower --scale or --size")


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

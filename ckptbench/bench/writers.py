"""The checkpoint writers under test, behind one small contract (:class:`Contender`): ckptbench,
torch.save, torch.distributed.checkpoint, safetensors, and fio as the raw-bytes reference (on object
storage: torch and DCP through s3fs, and DCP with s3torchconnector); the
bit-exact verification of what they load, and the compute probe that measures interference.

torch is imported inside the functions that use it (as in ``bench/workloads.py``), so the runner
(``bench.checkpoint``) imports this module without importing torch.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckptbench.errors import MissingDependencyError, StorageIOError, UsageError


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


class Contender:
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


class CkptbenchContender(Contender):
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


class TorchSaveContender(Contender):
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


class DcpContender(Contender):
    """torch.distributed.checkpoint in one process (``no_dist``), as the goals specify it."""

    name = "dcp"
    THREADS = 4
    durable = (f"dcp.save(FileSystemWriter(thread_count={THREADS}, sync_files=True)) fsyncs every file; "
               "directory fsync added")
    load_how = "dcp.load into freshly allocated tensors (allocation timed)"
    async_how = "dcp.async_save (thread executor): returns after staging a CPU copy; directory fsync added"

    @property
    def supports_async(self) -> bool:  # type: ignore[override]
        """``dcp.async_save`` exists (torch >= 2.3): the async round runs only where it does."""
        import torch.distributed.checkpoint as dcp

        return hasattr(dcp, "async_save")

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


class SafetensorsContender(Contender):
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


class FioReference(Contender):
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


# -- the competitors on object storage ---------------------------------------------------------------
# DCP's FsspecWriter/FsspecReader over s3fs, DCP with s3torchconnector's S3StorageWriter/S3StorageReader
# (the AWS CRT through Mountpoint's client), and torch.save/torch.load through an s3fs file. Each saves
# until every object is complete (uploads finished: S3 stores them durably before answering) and loads
# over the network into fresh memory; the runner verifies every load bit-exact.


#: DCP writers' threads on object storage (as the filesystem shoot-out's ``dcp``: FileSystemWriter(thread_count=4)).
OBJECT_DCP_THREADS = 4


def _s3fs_kwargs(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """``s3fs.S3FileSystem`` arguments reaching the endpoint ckptbench's own store reaches with these options."""
    try:
        import s3fs  # noqa: F401
    except ImportError:
        raise MissingDependencyError("this writer on s3:// goes through s3fs, which is not installed",
                                     hint="pip install s3fs (or 'ckptbench[s3]')") from None
    from ckptbench.storage.s3_clients import s3fs_arguments
    from ckptbench.storage.store import open_store

    return s3fs_arguments(open_store(url, storage_options))


class _TemplateLoads(Contender):
    """Loads into freshly allocated tensors shaped as the saved state_dict (allocation timed)."""

    def __init__(self) -> None:
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        self._template: list[tuple[str, tuple[int, ...], Any]] = []

    def prepare(self, state_dict: dict[str, Any]) -> None:
        self._template = [(k, tuple(v.shape), v.dtype) for k, v in state_dict.items()]

    def _empty(self) -> dict[str, Any]:
        import torch

        return {k: torch.empty(shape, dtype=dtype, device=self.device) for k, shape, dtype in self._template}


class DcpFsspecContender(_TemplateLoads):
    name = "dcp"
    durable = (f"dcp.save(FsspecWriter(URL, thread_count={OBJECT_DCP_THREADS})) over s3fs: every object's upload complete "
               "(S3 stores it durably before answering), .metadata last")
    load_how = "dcp.load(FsspecReader(URL)) over s3fs into freshly allocated tensors (allocation timed)"

    def __init__(self, storage_options: dict[str, Any] | None) -> None:
        super().__init__()
        self._options = storage_options

    def _save(self, state_dict: dict[str, Any], directory: Any) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        writer = FsspecWriter(str(directory), thread_count=OBJECT_DCP_THREADS, **_s3fs_kwargs(str(directory), self._options))
        dcp.save(state_dict, storage_writer=writer, no_dist=True)

    def _load(self, directory: Any) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        state_dict = self._empty()
        reader = FsspecReader(str(directory), **_s3fs_kwargs(str(directory), self._options))
        dcp.load(state_dict, storage_reader=reader, no_dist=True)
        return state_dict


class TorchS3fsContender(Contender):
    name = "torch"
    durable = "torch.save into an s3fs file (multipart upload of 16 MiB blocks), complete when the file closes"
    load_how = "the object read whole through s3fs, then torch.load(weights_only=True) from memory"
    FILE = "checkpoint.pt"

    def __init__(self, storage_options: dict[str, Any] | None) -> None:
        self._options = storage_options

    def _fs(self, url: str) -> Any:
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **_s3fs_kwargs(url, self._options))

    def _save(self, state_dict: dict[str, Any], directory: Any) -> None:
        import torch

        url = f"{directory}/{self.FILE}"
        with self._fs(url).open(url, "wb", block_size=16 * 2**20) as out:
            torch.save(state_dict, out)

    def _load(self, directory: Any) -> dict[str, Any]:
        import torch

        url = f"{directory}/{self.FILE}"
        with self._fs(url).open(url, "rb") as src:
            data = src.read()
        return torch.load(io.BytesIO(data), map_location=self.device, weights_only=True)


class S3TorchConnectorContender(_TemplateLoads):
    name = "s3torchconnector"
    durable = (f"dcp.save(s3torchconnector S3StorageWriter(thread_count={OBJECT_DCP_THREADS})): the AWS CRT's uploads "
               "complete, .metadata last")
    load_how = "dcp.load(s3torchconnector S3StorageReader) into freshly allocated tensors (allocation timed)"

    def __init__(self, storage_options: dict[str, Any] | None) -> None:
        super().__init__()
        try:
            import s3torchconnector.dcp  # noqa: F401
        except ImportError as exc:
            raise MissingDependencyError(f"the s3torchconnector writer needs s3torchconnector ({exc})",
                                         hint="pip install s3torchconnector (or 'ckptbench[s3torch]')") from None
        if storage_options and any(storage_options.get(k) for k in ("key", "secret", "aws_access_key_id")):
            raise UsageError("the s3torchconnector writer takes credentials from the environment or a profile, "
                             "not from storage options key/secret",
                             hint="set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE instead")
        self._options = storage_options

    def _filesystem(self, url: str) -> tuple[str, Any]:
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client
        from s3torchconnector.dcp import S3FileSystem

        from ckptbench.storage.store import open_store

        store = open_store(url, self._options)
        config = S3ClientConfig(part_size=store.options.part_size, force_path_style=store.addressing_style == "path",
                                profile=store.options.profile)
        endpoint = None if store.endpoint_source == "the default" else store.endpoint
        client = S3Client(store.region, endpoint=endpoint, s3client_config=config)
        return store.region, S3FileSystem(store.region, s3_client=client)

    def _save(self, state_dict: dict[str, Any], directory: Any) -> None:
        import torch.distributed.checkpoint as dcp
        from s3torchconnector.dcp import S3StorageWriter

        region, fs = self._filesystem(str(directory))
        writer = S3StorageWriter(region, str(directory), thread_count=OBJECT_DCP_THREADS)
        writer.fs, writer.path = fs, fs.init_path(str(directory))  # the endpoint and settings of the options
        dcp.save(state_dict, storage_writer=writer, no_dist=True)

    def _load(self, directory: Any) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp
        from s3torchconnector.dcp import S3StorageReader

        region, fs = self._filesystem(str(directory))
        reader = S3StorageReader(region, str(directory))
        reader.fs, reader.path = fs, fs.init_path(str(directory))
        state_dict = self._empty()
        dcp.load(state_dict, storage_reader=reader, no_dist=True)
        return state_dict


def make_object_writer(name: str, storage_options: dict[str, Any] | None) -> Contender | None:
    """The object-storage adapter of writer ``name`` (None: the writer has none; ckptbench's own
    writer handles URLs itself)."""
    if name == "dcp":
        return DcpFsspecContender(storage_options)
    if name == "torch":
        return TorchS3fsContender(storage_options)
    if name == "s3torchconnector":
        return S3TorchConnectorContender(storage_options)
    return None


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


WRITERS = ("ckptbench", "torch", "dcp", "safetensors", "fio", "s3torchconnector")


#: Writers that also save to object storage (the others write local files): on s3:// torch and dcp go
#: through s3fs, s3torchconnector is DCP with its S3StorageWriter (the contenders above).
OBJECT_WRITERS = ("ckptbench", "dcp", "torch", "s3torchconnector")


def make_writer(name: str, *, threads: int | None = None, block_size: int | None = None,
                storage_options: dict[str, Any] | None = None, device: str = "cpu", objects: bool = False) -> Contender:
    """The adapter for writer ``name`` (one of :data:`WRITERS`); MissingDependencyError if it cannot run here.
    ``objects``: the checkpoints go to object storage (URLs), reached with ``storage_options``; loads go
    to ``device``."""
    from ckptbench import knobs

    writer: Contender | None
    if objects and name != "ckptbench":  # ckptbench's own writer takes URLs itself
        writer = make_object_writer(name, storage_options)
        if writer is None:
            raise UsageError(f"writer {name!r} writes local files only", hint=f"on object storage: "
                             f"{', '.join(OBJECT_WRITERS)}")
    elif name == "s3torchconnector":
        raise UsageError("the s3torchconnector writer saves to s3:// only", hint="drop it from --writers here")
    elif name == "ckptbench":
        writer = CkptbenchContender(threads, storage_options)
    elif name == "torch":
        writer = TorchSaveContender()
    elif name == "dcp":
        writer = DcpContender()
    elif name == "safetensors":
        writer = SafetensorsContender()
    elif name == "fio":
        writer = FioReference(threads or knobs.SAVE_THREADS, block_size or knobs.SAVE_BLOCK_BYTES)
    else:
        raise UsageError(f"unknown writer {name!r}", hint=f"known: {', '.join(WRITERS)}")
    writer.device = device
    return writer



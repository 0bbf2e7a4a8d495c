"""The competitor writers on object storage (``bench s3://... --workload checkpoint --writers ...``):
DCP's FsspecWriter/FsspecReader over s3fs, DCP with s3torchconnector's S3StorageWriter/S3StorageReader
(the AWS CRT through Mountpoint's client), and torch.save/torch.load through an s3fs file. Each saves
until every object is complete (uploads finished: S3 stores them durably before answering) and loads
over the network into fresh memory; the runner verifies every load bit-exact.

torch, s3fs and s3torchconnector are imported inside the functions that use them.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

from ckptbench.bench.writers import Contender
from ckptbench.errors import MissingDependencyError, UsageError

#: DCP writers' threads (as the filesystem shoot-out's ``dcp``: FileSystemWriter(thread_count=4)).
THREADS = 4


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


class DcpFsspecWriter(_TemplateLoads):
    name = "dcp"
    durable = (f"dcp.save(FsspecWriter(URL, thread_count={THREADS})) over s3fs: every object's upload complete "
               "(S3 stores it durably before answering), .metadata last")
    load_how = "dcp.load(FsspecReader(URL)) over s3fs into freshly allocated tensors (allocation timed)"

    def __init__(self, storage_options: dict[str, Any] | None) -> None:
        super().__init__()
        self._options = storage_options

    def _save(self, state_dict: dict[str, Any], directory: Any) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        writer = FsspecWriter(str(directory), thread_count=THREADS, **_s3fs_kwargs(str(directory), self._options))
        dcp.save(state_dict, storage_writer=writer, no_dist=True)

    def _load(self, directory: Any) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        state_dict = self._empty()
        reader = FsspecReader(str(directory), **_s3fs_kwargs(str(directory), self._options))
        dcp.load(state_dict, storage_reader=reader, no_dist=True)
        return state_dict


class TorchS3fsWriter(Contender):
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


class S3TorchConnectorWriter(_TemplateLoads):
    name = "s3torchconnector"
    durable = (f"dcp.save(s3torchconnector S3StorageWriter(thread_count={THREADS})): the AWS CRT's uploads "
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
        path_style = (store.options.addressing_style or ("path" if store.endpoint_source != "the default"
                                                         else "virtual")) == "path"
        config = S3ClientConfig(part_size=store.options.part_size, force_path_style=path_style,
                                profile=store.options.profile)
        endpoint = None if store.endpoint_source == "the default" else store.endpoint
        client = S3Client(store.region, endpoint=endpoint, s3client_config=config)
        return store.region, S3FileSystem(store.region, s3_client=client)

    def _save(self, state_dict: dict[str, Any], directory: Any) -> None:
        import torch.distributed.checkpoint as dcp
        from s3torchconnector.dcp import S3StorageWriter

        region, fs = self._filesystem(str(directory))
        writer = S3StorageWriter(region, str(directory), thread_count=THREADS)
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
        return DcpFsspecWriter(storage_options)
    if name == "torch":
        return TorchS3fsWriter(storage_options)
    if name == "s3torchconnector":
        return S3TorchConnectorWriter(storage_options)
    return None

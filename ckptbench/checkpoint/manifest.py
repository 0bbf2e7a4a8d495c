"""The manifest: the commit record of a checkpoint, written last and atomically.

A location holds a checkpoint exactly when it holds a valid ``manifest.json``. Commit order:
shards durable (``Store.write_files``) -> manifest put atomically (``Store.put_atomic``: locally a
temp name, fsync, rename, directory fsync). A crash at any point leaves either the previous manifest
(and the shards it names, which a save never touches) or the new one.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
from collections.abc import Callable
from typing import Any

from ckptbench.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InsufficientSpaceError,
    NotACheckpointError,
    UnknownFormatError,
    UnsafeFileError,
    UsageError,
)
from ckptbench.storage.store import Store
from ckptbench.units import clipped, format_size

MANIFEST_NAME = "manifest.json"
FORMAT = "ckptbench.checkpoint/1"
#: Files a save may create: shards named by save id, the manifest's temp name, and the engine's
#: O_DIRECT probe (``csrc/engine.cpp``) and the per-mount tuning probe (``checkpoint/tuning.py``), left
#: behind by a save killed during them.
#: Under a distributed launch shards carry the rank too: ``shard-<save id>-r<rank>-<index>.bin``.
OWNED_FILE = re.compile(r"^(shard-[0-9a-f]{8}(-r\d{5})?-\d{5}\.bin|\.manifest\.json\.tmp-[0-9a-f]{8}"
                        r"|\.ckptbench-direct-probe-\d+-\d+|\.ckptbench-tune-[0-9a-f]{6}-\d+)$")


def commit(store: Store, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` durably and atomically as the store's ``manifest.json``: the commit.

    A disk that fills up (or a quota reached) before the manifest is whole raises InsufficientSpaceError
    saying how much it needed; the previous manifest, if any, stays in place."""
    data = json.dumps(manifest, separators=(",", ":")).encode()
    try:
        store.put_atomic(MANIFEST_NAME, data)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        try:
            free = store.free_bytes()
        except OSError:
            free = None
        has = "the free space is unknown" if free is None else f"{format_size(free)} is free"
        raise InsufficientSpaceError(
            f"{store.url} ran out of space while committing the checkpoint: the manifest needs "
            f"{format_size(len(data))}, {has}; nothing was committed",
            hint="free space or save elsewhere; a checkpoint committed earlier is intact") from exc


def read_manifest(store: Store) -> dict[str, Any]:
    """The committed manifest of ``store``; NotACheckpointError with the reason otherwise."""
    path = f"{store.url}/{MANIFEST_NAME}"
    if not store.is_dir_like():
        raise NotACheckpointError(f"{store.url} is not a directory holding a checkpoint",
                                  hint="a file torch.save wrote is read with torch.load" if os.path.isfile(store.url)
                                  else None)
    try:
        manifest = json.loads(store.get(MANIFEST_NAME), object_pairs_hook=_unique_keys)
    except UnsafeFileError as exc:  # a symlink, FIFO or device as the manifest, or one larger than any save writes
        raise NotACheckpointError(f"{store.url} holds no readable checkpoint: {exc}") from None
    except FileNotFoundError:
        if not store.list():
            raise CheckpointNotFoundError(f"{store.url}: no checkpoint there (nothing at that path)") from None
        raise NotACheckpointError(
            f"{store.url} holds no committed checkpoint (no {MANIFEST_NAME})",
            hint="a save that did not finish leaves no manifest; nothing here can be loaded",
        ) from None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested absurdly deep
        raise NotACheckpointError(f"{path} is not a valid manifest: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        # another version of ours (a newer ckptbench wrote it) is not damage
        error = UnknownFormatError if isinstance(found, str) and found.startswith("ckptbench.checkpoint/") \
            else NotACheckpointError
        raise error(f"{path} has format {found!r}; this ckptbench reads {FORMAT!r}")
    return manifest


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: a save never writes a key twice, so a second one
    is an edit, and which of the two would win is not for the reader to guess."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"the key {twice!r} appears twice in one object")
    return obj


def stale_files(store: Store, keep: set[str]) -> list[str]:
    """Objects a save created that the committed manifest no longer names (older or crashed saves)."""
    return [name for name in store.list() if OWNED_FILE.match(name) and name not in keep]


def rank_part(manifest: dict[str, Any], where: str, *, rank: int | None, world_size: int) -> dict[str, Any]:
    """The part of ``manifest`` one process loads: all of a single-process save; of a save by N
    ranks, part ``rank`` when given, else this launch's own rank's part (``world_size`` must be N).

    Raises UsageError for a rank or world size that does not match how it was saved (resharding is
    not supported); NotACheckpointError or CorruptCheckpointError for a malformed part (see
    :func:`check_part`)."""
    parts = manifest.get("ranks")
    if parts is None:
        if rank not in (None, 0):
            raise UsageError(f"{where} was saved by one process; it has no rank {rank}")
        part = manifest
    else:
        saved = manifest.get("world_size")
        if not isinstance(parts, list) or saved != len(parts) or not parts:
            raise NotACheckpointError(f"{where}/{MANIFEST_NAME} says world_size {saved!r} but lists "
                                      f"{len(parts) if isinstance(parts, list) else 'no'} rank parts")
        if rank is None or world_size != saved and world_size > 1:
            here = f"this launch has {world_size} ranks" if world_size > 1 else "this is one process"
            raise UsageError(f"{where} was saved by {saved} ranks and {here}: each rank loads its own part, so "
                             f"it loads under a launch of {saved} ranks (resharding is not supported)",
                             hint=f"to read one rank's state_dict in one process, pass rank=K (0..{saved - 1})")
        if not 0 <= rank < saved:
            raise UsageError(f"{where} was saved by {saved} ranks; rank {rank} is not one of 0..{saved - 1}")
        part = parts[rank]
    missing = [k for k in ("shards", "tensors", "skeleton") if not isinstance(part, dict) or k not in part]
    if missing:
        raise NotACheckpointError(f"{where}/{MANIFEST_NAME} lacks {', '.join(missing)}"
                                  + (f" for rank {rank}" if parts is not None else ""))
    check_part(manifest, part, f"{where}/{MANIFEST_NAME}" + (f" (rank {rank})" if parts is not None else ""))
    return part


def check_part(manifest: dict[str, Any], part: dict[str, Any], where: str) -> None:
    """Check, before anything is read, that ``part`` of ``manifest`` (``where`` names it) describes
    data a load can use: every field of the right type, every tensor inside its shard, every index
    in range, the skeleton well formed. The shards themselves are checked against it by the load.

    Raises NotACheckpointError for a malformed field (not written by a save), CorruptCheckpointError
    for references that do not hold together (a tensor past its shard's end, a shard index out of
    range); the message names the manifest and the tensor."""
    import torch  # dtypes; only a load, which needs torch anyway, gets here

    def malformed(what: str) -> NotACheckpointError:
        return NotACheckpointError(f"{where} is not a valid manifest: {what}",
                                   hint="it was not written by a ckptbench save, or was damaged; restore from "
                                        "another checkpoint")

    def corrupt(what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"{where}: {what}", hint="the checkpoint is damaged; restore from another one")

    _check_checksum(manifest.get("checksum"), malformed)
    shards, tensors = part["shards"], part["tensors"]
    dtypes: dict[str, Any] = {}  # by name, looked up once
    _check_shards(shards, malformed)
    if not isinstance(tensors, list):
        raise malformed(f"tensors is a {type(tensors).__name__}, not a list")
    for i, t in enumerate(tensors):
        if not isinstance(t, dict) or not isinstance(t.get("key"), str):
            raise malformed(f"tensor {i} is {clipped(t)}, not an object with a 'key'")
        key = t["key"]
        if not t.keys() >= _TENSOR_FIELDS:
            raise malformed(f"tensor {key!r} lacks {', '.join(sorted(_TENSOR_FIELDS - t.keys()))}")
        dtype = dtypes.get(t["dtype"]) if type(t["dtype"]) is str else None
        if dtype is None and type(t["dtype"]) is str:
            dtype = dtypes[t["dtype"]] = getattr(torch, t["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise malformed(f"tensor {key!r} has dtype {clipped(t['dtype'])}, which torch does not know")
        shape = t["shape"]
        if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
            raise malformed(f"tensor {key!r} has shape {clipped(shape)}, not a list of ints >= 0")
        if len(shape) > MAX_DIMS or math.prod(max(n, 1) for n in shape) > MAX_ELEMENTS:
            # torch keeps sizes and strides in int64: beyond it, even an empty tensor cannot be made
            raise malformed(f"tensor {key!r} has shape {clipped(shape)}: more than {MAX_DIMS} dimensions or "
                            f"2**63 elements, which no tensor can have")
        for field in ("nbytes", "offset"):
            if not _is_count(t[field]):
                raise malformed(f"tensor {key!r} has {field} {clipped(t[field])}, not an int >= 0")
        if type(t["shard"]) is not int:
            raise malformed(f"tensor {key!r} has shard {clipped(t['shard'])}, not an int")
        alias = t["alias_of"]
        if alias is not None and type(alias) is not int:
            raise malformed(f"tensor {key!r} has alias_of {clipped(alias)}, not null or an int")
        _check_crcs(key, t["crc32c"], malformed)
        if math.prod(shape) * dtype.itemsize != t["nbytes"]:
            raise corrupt(f"tensor {key!r} has {t['nbytes']} bytes, but shape {shape} of {t['dtype']} "
                          f"needs {math.prod(shape) * dtype.itemsize}")
        if alias is not None:
            if not 0 <= alias < i:
                raise corrupt(f"tensor {key!r} is an alias of tensor {alias}, which is not one of the {i} "
                              f"tensors before it")
            if (tensors[alias]["dtype"], tensors[alias]["shape"]) != (t["dtype"], shape):
                raise corrupt(f"tensor {key!r} is an alias of {tensors[alias]['key']!r}, which has another "
                              f"dtype or shape")
        elif t["nbytes"]:
            if not 0 <= t["shard"] < len(shards):
                raise corrupt(f"tensor {key!r} is in shard {t['shard']}, but the manifest lists "
                              f"{len(shards)} shards")
            shard = shards[t["shard"]]
            if t["offset"] % dtype.itemsize:  # shards start page-aligned in the read buffer
                raise corrupt(f"tensor {key!r} starts at byte {t['offset']} of shard {shard['name']}, not a "
                              f"multiple of its element size ({dtype.itemsize} bytes for {t['dtype']})")
            if t["offset"] + t["nbytes"] > shard["nbytes"]:
                raise corrupt(
                    f"tensor {key!r} (bytes {t['offset']}..{t['offset'] + t['nbytes']}) runs past the end "
                    f"of shard {shard['name']} ({shard['nbytes']} bytes)")
    try:
        problem = _skeleton_problem(part["skeleton"], len(tensors))
    except RecursionError:
        problem = "nested too deeply"
    if problem:
        raise malformed(f"skeleton: {problem}")
    problem = _byte_leaf_problems(part["skeleton"], tensors)
    if problem:
        raise corrupt(problem)


def check_layout(manifest: dict[str, Any], where: str) -> None:
    """Check, without torch, what a copy of the checkpoint byte for byte relies on (``checkpoint/drain.py``):
    every part's shards flat file names with sizes, each name once in the manifest, every stored tensor's
    range inside its shard, its checksums 32-bit ints. NotACheckpointError for a malformed field,
    CorruptCheckpointError for a range past its shard; :func:`check_part` checks the rest (dtypes, shapes,
    the skeleton) for a load."""
    def malformed(what: str) -> NotACheckpointError:
        return NotACheckpointError(f"{where}/{MANIFEST_NAME} is not a valid manifest: {what}",
                                   hint="it was not written by a ckptbench save, or was damaged")

    _check_checksum(manifest.get("checksum"), malformed)
    parts = manifest.get("ranks")
    if parts is not None and not isinstance(parts, list):
        raise malformed(f"ranks is {clipped(parts)}, not a list")
    named: set[str] = set()
    for part in [manifest] if parts is None else parts:
        shards, tensors = (part.get("shards"), part.get("tensors")) if isinstance(part, dict) else (None, None)
        if not isinstance(shards, list) or not isinstance(tensors, list):
            raise malformed(f"a part lacks its lists of shards and tensors: {clipped(part)}")
        _check_shards(shards, malformed)
        for s in shards:  # a copy writes each file once: one name, one size
            if s["name"] in named:
                raise malformed(f"the shard {s['name']!r} is named twice")
            named.add(s["name"])
        for i, t in enumerate(tensors):
            if not (isinstance(t, dict) and isinstance(t.get("key"), str) and _is_count(t.get("nbytes"))
                    and _is_count(t.get("offset")) and type(t.get("shard")) is int
                    and (t.get("alias_of") is None or type(t["alias_of"]) is int)):
                raise malformed(f"tensor {i} is {clipped(t)}, not one a save writes")
            _check_crcs(t["key"], t.get("crc32c"), malformed)
            if t.get("alias_of") is None and t["nbytes"]:
                if not 0 <= t["shard"] < len(shards):
                    raise CorruptCheckpointError(f"{where}: tensor {t['key']!r} is in shard {t['shard']}, but the "
                                                 f"manifest lists {len(shards)} shards")
                if t["offset"] + t["nbytes"] > shards[t["shard"]]["nbytes"]:
                    raise CorruptCheckpointError(f"{where}: tensor {t['key']!r} runs past the end of shard "
                                                 f"{shards[t['shard']]['name']}")


#: Bounds of a tensor's shape: torch's sizes and strides are int64, and it allows 64 dimensions at most.
MAX_DIMS = 64
MAX_ELEMENTS = 2**63 - 1
_TENSOR_FIELDS = frozenset({"dtype", "shape", "nbytes", "shard", "offset", "alias_of", "crc32c"})
_FLAT_NAME = re.compile(r"^(?!\.\.?$)[^/\\\x00]+$")


#: The smallest checksum block a manifest may give (the writer's is 64 MiB): a load makes one range check per
#: block, so a tiny one would have a small manifest make it build hundreds of millions of them.
MIN_CHECKSUM_BLOCK_BYTES = 2**20


def _check_checksum(checksum: Any, malformed: Callable[[str], Exception]) -> None:
    """The manifest's ``checksum`` field: null, or a dict whose ``block_bytes`` is a whole number of at least
    :data:`MIN_CHECKSUM_BLOCK_BYTES`; else ``malformed(what)`` raised."""
    if checksum is None:
        return
    if not (isinstance(checksum, dict) and _is_count(checksum.get("block_bytes"))
            and checksum["block_bytes"] >= MIN_CHECKSUM_BLOCK_BYTES):
        raise malformed(f"checksum is {clipped(checksum)}, not null or {{'block_bytes': <int >= "
                        f"{MIN_CHECKSUM_BLOCK_BYTES}>, ...}}")


def _check_shards(shards: Any, malformed: Callable[[str], Exception]) -> None:
    """A part's ``shards``: a list of ``{'name': <a flat file name>, 'nbytes': <int >= 0>}``; else ``malformed``."""
    if not isinstance(shards, list):
        raise malformed(f"shards is a {type(shards).__name__}, not a list")
    for i, s in enumerate(shards):
        if not (isinstance(s, dict) and isinstance(s.get("name"), str) and _is_count(s.get("nbytes"))):
            raise malformed(f"shard {i} is {clipped(s)}, not {{'name': <str>, 'nbytes': <int >= 0>}}")
        if not _FLAT_NAME.match(s["name"]):  # names are flat (store.py): never a path out of the checkpoint
            raise malformed(f"shard {i} has the name {s['name']!r}, not a file name inside the checkpoint")


def _check_crcs(key: str, crcs: Any, malformed: Callable[[str], Exception]) -> None:
    """A tensor's ``crc32c``: null or a list of 32-bit ints; else ``malformed``."""
    if crcs is not None and (type(crcs) is not list or not all(type(c) is int and 0 <= c < 2**32 for c in crcs)):
        raise malformed(f"tensor {key!r} has crc32c {clipped(crcs)}, not null or a list of 32-bit ints")


def _is_count(value: Any) -> bool:
    """An int >= 0 as JSON gives it (bool is an int to Python; not here)."""
    return type(value) is int and value >= 0



#: The node kinds of a skeleton, each with the optional keys it may carry besides its tag.
_NODE_EXTRAS = {"__tensor__": {"__parameter__", "__requires_grad__", "__numpy__", "__bytes__", "__pickle__"},
               "__dict__": {"__ordered__", "__metadata__", "__counter__"},
                "__list__": set(), "__tuple__": {"__class__", "__fields__"}, "__value__": set()}


def _skeleton_problem(node: Any, tensors: int) -> str | None:
    """What is wrong with a skeleton (the grammar ``state_dict_format.flatten`` writes), or None."""
    tag = next((t for t in _NODE_EXTRAS if t in node), None) if isinstance(node, dict) else None
    if tag is None or not set(node) <= _NODE_EXTRAS[tag] | {tag}:
        return f"{clipped(node)} is not a node"
    problem = _extras_problem(node)
    if problem:
        return problem
    value = node[tag]
    if tag == "__tensor__":
        ok = type(value) is int and 0 <= value < tensors
        return None if ok else f"tensor index {clipped(value)} is not one of 0..{tensors - 1}"
    if tag in ("__list__", "__tuple__"):
        if not isinstance(value, list):
            return f"{tag} holds {clipped(value)}, not a list"
        return next((p for p in (_skeleton_problem(v, tensors) for v in value) if p), None)
    if tag == "__dict__":
        if not isinstance(value, list):
            return f"__dict__ holds {clipped(value)}, not a list"
        for item in value:
            if not (isinstance(item, list) and len(item) == 2):
                return f"dict item {clipped(item)} is not a [key, node] pair"
            key, child = item
            if not (isinstance(key, str) or isinstance(key, dict) and set(key) == {"__key__"}
                    and _value_ok(key["__key__"], hashable=True)):
                return f"dict key {clipped(key)} is not a str or a {{'__key__': <hashable value>}}"
            problem = _skeleton_problem(child, tensors)
            if problem:
                return problem
        return None
    return None if _value_ok(value, hashable=False) else f"value {clipped(value)} cannot be decoded"


def _extras_problem(node: dict) -> str | None:
    """What is wrong with a node's optional keys (their types and shapes), or None."""
    for flag in ("__parameter__", "__requires_grad__", "__ordered__", "__counter__"):
        if flag in node and type(node[flag]) is not bool:
            return f"{flag} is {clipped(node[flag])}, not true or false"
    if "__metadata__" in node:
        if node.get("__ordered__") is not True:
            return "__metadata__ belongs to an OrderedDict (__ordered__: true)"
        if not _metadata_ok(node["__metadata__"]):
            return f"__metadata__ {clipped(node['__metadata__'])} is not [[prefix, [[name, value], ...]], ...]"
    problem = _tuple_class_problem(node)
    if problem is not None:
        return problem
    if "__pickle__" in node and node["__pickle__"] is not True:
        return f"__pickle__ is {clipped(node['__pickle__'])}, not true"
    if "__bytes__" in node and node["__bytes__"] not in ("bytes", "bytearray"):
        return f"__bytes__ is {clipped(node['__bytes__'])}, not 'bytes' or 'bytearray'"
    if sum(kind in node for kind in ("__numpy__", "__bytes__", "__pickle__")) > 1:
        return "a tensor node is at most one of a numpy array, bytes or a pickle"
    if "__numpy__" in node:
        return _numpy_problem(node["__numpy__"])
    return None


def _numpy_problem(spec: Any) -> str | None:
    """What is wrong with a numpy node's ``{"dtype", "shape", "scalar"}``, or None. Only the dtypes a
    save writes: no Python objects (their bytes would be pointers) and no fields."""
    import numpy as np

    if not (isinstance(spec, dict) and set(spec) == {"dtype", "shape", "scalar"} and isinstance(spec["dtype"], str)
            and type(spec["scalar"]) is bool and type(spec["shape"]) is list
            and all(type(n) is int and n >= 0 for n in spec["shape"])):
        return f"__numpy__ {clipped(spec)} is not {{'dtype': <str>, 'shape': [<int >= 0>, ...], 'scalar': <bool>}}"
    try:
        dtype = np.dtype(spec["dtype"])
    except (TypeError, ValueError, SyntaxError):
        return f"__numpy__ dtype {clipped(spec['dtype'])} is not a numpy dtype"
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None or dtype.str != spec["dtype"]:
        return f"__numpy__ dtype {clipped(spec['dtype'])} is not one a save writes"
    if spec["scalar"] and spec["shape"]:
        return f"__numpy__ {clipped(spec)} is a scalar with a shape"
    if len(spec["shape"]) > MAX_DIMS or math.prod(max(n, 1) for n in spec["shape"]) > MAX_ELEMENTS:
        # numpy counts elements in an intp: a shape past it (of a dtype of no bytes, whose size the
        # tensor's bytes do not bound) would overflow, not fail
        return f"__numpy__ shape {clipped(spec['shape'])} has more than {MAX_DIMS} dimensions or 2**63 elements"
    return None


def _byte_leaf_problems(node: Any, tensors: list[dict], where: str = "") -> str | None:
    """Tensors that hold a numpy array, bytes or a pickle must be flat uint8 of exactly their bytes."""
    if not isinstance(node, dict):
        return None
    if "__tensor__" in node:
        spec = node.get("__numpy__")
        if spec is None and not ("__bytes__" in node or "__pickle__" in node):
            return None
        entry = tensors[node["__tensor__"]]
        if entry["dtype"] != "uint8" or len(entry["shape"]) != 1:
            return f"tensor {entry['key']!r} holds bytes but is {entry['dtype']} of shape {entry['shape']}"
        if spec is not None:
            import numpy as np

            needed = math.prod(spec["shape"]) * np.dtype(spec["dtype"]).itemsize
            if needed != entry["nbytes"]:
                return (f"tensor {entry['key']!r} has {entry['nbytes']} bytes, but a numpy array of shape "
                        f"{spec['shape']} and dtype {spec['dtype']} needs {needed}")
        return None
    children = (node.get("__list__") or node.get("__tuple__") or
                [child for _, child in node.get("__dict__") or ()])
    return next((p for p in (_byte_leaf_problems(c, tensors) for c in children) if p), None)


def _metadata_ok(metadata: Any) -> bool:
    """``state_dict_format.encode_metadata``'s shape: [[prefix, [[name, None|bool|int|str], ...]], ...]."""
    def pair(item: Any, value_ok: Any) -> bool:
        return isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and value_ok(item[1])

    def scalar(value: Any) -> bool:
        return value is None or isinstance(value, (bool, int, str))

    return isinstance(metadata, list) and all(
        pair(entry, lambda pairs: isinstance(pairs, list) and all(pair(p, scalar) for p in pairs))
        for entry in metadata)


def _tuple_class_problem(node: dict) -> str | None:
    """What is wrong with a tuple node's ``__class__`` / ``__fields__`` (a tuple subclass), or None."""
    if "__class__" in node and not (isinstance(node["__class__"], str) and ":" in node["__class__"]):
        return f"__class__ {clipped(node['__class__'])} is not a 'module:qualname'"
    if "__fields__" in node:
        fields = node["__fields__"]
        if "__class__" not in node or not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
            return f"__fields__ {clipped(fields)} of {clipped(node.get('__class__'))} are not a namedtuple's"
    return None


def _value_ok(value: Any, *, hashable: bool) -> bool:
    """Whether a plain value decodes (``{"__tuple__": [...]}``, ``{"__float__": "nan"}``, lists, scalars)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, list):
        return not hashable and all(_value_ok(v, hashable=False) for v in value)
    if isinstance(value, dict):
        if "__tuple__" in value:
            items = value["__tuple__"]
            return (isinstance(items, list) and all(_value_ok(v, hashable=hashable) for v in items)
                    and _tuple_class_problem(value) is None)
        if "__float__" in value:
            try:
                float(value["__float__"])
            except (TypeError, ValueError):
                return False
            return True
        if "__complex__" in value:
            text = value["__complex__"]
            return set(value) == {"__complex__"} and isinstance(text, str) and _complex_ok(text)
        for kind in ("__dtype__", "__device__"):
            if kind in value:
                name = value[kind]
                return set(value) == {kind} and isinstance(name, str) and _TORCH_NAME.fullmatch(name) is not None
        if "__bytes__" in value:
            return set(value) == {"__bytes__"} and isinstance(value["__bytes__"], str) and _base64_ok(value["__bytes__"])
        for kind in ("__set__", "__frozenset__"):
            if kind in value:
                items = value[kind]
                return (set(value) == {kind} and (kind == "__frozenset__" or not hashable) and isinstance(items, list)
                        and all(_value_ok(v, hashable=True) for v in items))
        if "__path__" in value:
            return (set(value) == {"__path__", "__flavour__", "__pure__"} and isinstance(value["__path__"], str)
                    and value["__flavour__"] in ("posix", "windows") and type(value["__pure__"]) is bool)
        if "__enum__" in value:
            return (set(value) <= {"__enum__", "__member__", "__raw__"} and isinstance(value["__enum__"], str)
                    and ":" in value["__enum__"] and isinstance(value.get("__member__"), str)
                    and ("__raw__" not in value or _value_ok(value["__raw__"], hashable=False)))
        return not hashable
    return False


#: A torch dtype's name (``bfloat16``) or a device's (``cuda:1``), as a save records them.
_TORCH_NAME = re.compile(r"[a-z][a-z0-9_]*(:[0-9]+)?")


def _complex_ok(text: str) -> bool:
    try:
        complex(text)
    except ValueError:
        return False
    return True


def _base64_ok(text: str) -> bool:
    import base64
    import binascii

    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True

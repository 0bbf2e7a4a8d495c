"""The state-dict format: a state_dict flattened into tensors (in entry order) and a JSON-ready
skeleton, and rebuilt from them.

The skeleton is the state_dict's structure with each tensor replaced by ``{"__tensor__": index}``;
plain values, containers and their types are encoded so that :func:`rebuild` gives back what was
saved (OrderedDict with its ``_metadata``, Counter, nn.Parameter, namedtuples, Enum members, numpy arrays,
bytes, sets, paths, complex numbers, torch dtypes and devices). Values of any other type are pickled
only with ``allow_pickle``. Flattening also records, for each tensor, its data address and staging
route (``routing.Sources``) and what the shard layout depends on (``plan.PlanCache``). No I/O.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import enum
import functools
import logging
import math
import pathlib
import pickle
import sys
import types
import warnings
from typing import Any, NoReturn

import numpy as np

from ckptbench.checkpoint.routing import Sources, route_for
from ckptbench.errors import PickleNotAllowedError, UnknownTorchValueError, UsageError

log = logging.getLogger(__name__)


def _is_tensor(value: Any) -> bool:
    """A torch.Tensor, subclasses included (nn.Parameter, a library's own parameter class)."""
    kind = type(value)
    if kind.__module__.startswith("torch"):  # the common case, without a torch import
        return hasattr(value, "untyped_storage")
    return "torch" in sys.modules and isinstance(value, sys.modules["torch"].Tensor)


def _encode_key(key: Any, path: str) -> Any:
    """Dict keys: str stays str; other hashable values (int, float, bool, None, tuple, bytes,
    frozenset, Enum, path) are tagged so they come back as they were."""
    if type(key) is str:
        return key
    try:
        return {"__key__": _encode_value(key, path)}
    except UsageError:
        raise UsageError(f"{path}: dict key {key!r} of type {type(key).__name__} cannot be saved",
                         hint="use str, int, float, bool, None, bytes, tuple, frozenset, Enum or path keys") from None


#: What a refused value's error suggests.
_VALUES_HINT = ("state_dict leaves must be tensors, numpy arrays or plain Python values (numbers, str, bytes, bool, "
                "None, lists, tuples, dicts, sets, pathlib paths, Enum members, torch dtypes and devices); pass "
                "allow_pickle=True, at save and again at load, to pickle anything else")


def _encode_value(value: Any, path: str) -> Any:
    """A plain Python value as JSON: tuples, non-finite floats, bytes, sets, paths and Enum members are
    tagged (``{"__tuple__": ...}``, ``{"__float__": "nan"}``, ``{"__bytes__": base64}``, ...)."""
    if isinstance(value, enum.Enum):  # before int and str: an IntEnum or StrEnum member is one too
        return _encode_enum(value, path)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, complex):
        return {"__complex__": repr(complex(value))}
    if isinstance(value, (list, tuple)):
        items = [_encode_value(v, f"{path}[{i}]") for i, v in enumerate(value)]
        # A namedtuple or torch.Size (dict keys: a tuple value is visited as a container) keeps its class.
        return items if isinstance(value, list) else _sequence_node(value, items)
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode("ascii")}
    if isinstance(value, (set, frozenset)):
        items = [_encode_value(v, f"{path}{{{i}}}") for i, v in enumerate(value)]
        return {"__frozenset__" if isinstance(value, frozenset) else "__set__": items}
    if isinstance(value, pathlib.PurePath):
        return {"__path__": str(value), "__flavour__": "windows" if isinstance(value, pathlib.PureWindowsPath)
                else "posix", "__pure__": not isinstance(value, pathlib.Path)}
    torch = sys.modules.get("torch")  # a torch value comes with torch imported
    if torch is not None and isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    if torch is not None and isinstance(value, torch.device):
        return {"__device__": str(value)}
    raise UsageError(f"{path}: value of type {type(value).__name__} cannot be saved", hint=_VALUES_HINT)


def _encode_enum(member: enum.Enum, path: str) -> dict[str, Any]:
    """An Enum member by its class's import path and its name (as namedtuples are recorded), and its
    value where that is a plain value (what comes back when the class is not imported at load)."""
    kind = type(member)
    node: dict[str, Any] = {"__enum__": f"{kind.__module__}:{kind.__qualname__}", "__member__": str(member.name)}
    with contextlib.suppress(UsageError):
        node["__raw__"] = _encode_value(member.value, f"{path}.value")
    return node


class Flattener:
    def __init__(self, allow_pickle: bool = False) -> None:
        self.allow_pickle = allow_pickle
        self.tensors = Sources()
        self.entries: list[Row] = []
        self.later: list[tuple[dict, list]] = []
        self.skeleton: Any = None
        self._seen: dict[tuple, int] = {}
        #: What the layout depends on, in visiting order (see :class:`PlanCache`): each container's type
        #: and length, each key, each tensor's :func:`_tensor_record` (made by ``_tensor``), each plain
        #: value's place (None), not its value.
        self.record: list = []

    def visit(self, value: Any, path: str) -> Any:
        if _is_tensor(value):
            return _tensor_node(self._tensor(value, path), value)
        if isinstance(value, dict):
            self.record.append((type(value), len(value)))
            return self._dict_node(value, [[self._key(k, path), self.visit(v, f"{path}.{k}" if path else str(k))]
                                           for k, v in value.items()])
        if isinstance(value, (list, tuple)):
            self.record.append((type(value), len(value)))
            return _sequence_node(value, [self.visit(v, f"{path}[{i}]") for i, v in enumerate(value)])
        if isinstance(value, (np.ndarray, np.generic)):
            return self._numpy(value, path or "<root>")
        if isinstance(value, (bytes, bytearray)):
            return self._bytes(value, path)
        self.record.append(None)  # a plain value's place: [0, t] and [t, 0] key t differently
        try:
            return {"__value__": _encode_value(value, path or "<root>")}
        except UsageError:
            if not self.allow_pickle:
                raise
        self.record.pop()
        return self._pickled(value, path or "<root>")

    def _numpy(self, value: Any, path: str) -> dict:
        """A numpy array (or scalar) as a tensor of its bytes, with its dtype and shape beside it."""
        array = np.asarray(value)
        dtype = array.dtype
        if dtype.hasobject or dtype.fields is not None:
            if self.allow_pickle:
                return self._pickled(value, path)
            raise UsageError(f"{path}: a numpy array of dtype {dtype} holds Python objects or fields and cannot be "
                             "saved as bytes", hint="pass allow_pickle=True, at save and again at load, to pickle it")
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8) if array.nbytes else np.empty(0, np.uint8)
        node = _tensor_node(self._tensor(_torch_of(raw), path), None)
        node["__numpy__"] = {"dtype": dtype.str, "shape": list(array.shape), "scalar": isinstance(value, np.generic)}
        return node

    def _bytes(self, value: bytes | bytearray, path: str) -> dict:
        data = bytes(value) if isinstance(value, bytearray) else value  # a bytearray may be resized meanwhile
        node = _tensor_node(self._tensor(_torch_of(np.frombuffer(data, np.uint8)), path), None)
        node["__bytes__"] = type(value).__name__
        return node

    def _pickled(self, value: Any, path: str) -> dict:
        try:
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - whatever the object's __reduce__ raises
            raise UsageError(f"{path}: value of type {type(value).__name__} cannot be pickled: {exc}") from exc
        node = _tensor_node(self._tensor(_torch_of(np.frombuffer(data, np.uint8)), path), None)
        node["__pickle__"] = True
        return node

    def _key(self, key: Any, path: str) -> Any:
        self.record.append(key if type(key) is str else (type(key), repr(key)))  # repr: 2.0 is not 2
        return _encode_key(key, path)

    def _dict_node(self, value: dict, pairs: list) -> dict:
        node: dict[str, Any] = {"__dict__": pairs}
        if type(value) is not dict and isinstance(value, collections.OrderedDict):
            node["__ordered__"] = True
            metadata = getattr(value, "_metadata", None)
            if isinstance(metadata, dict):
                self.later.append((node, list(metadata.items())))
        elif isinstance(value, collections.Counter):  # kept, as torch.load(weights_only=True) keeps it
            node["__counter__"] = True
        return node

    def _tensor(self, t: Any, path: str) -> int:
        # Runs once per tensor of the state_dict, inside an async save's stall: keep it lean.
        if t.layout is not _torch().strided or t.is_quantized or t.is_meta:
            _refuse(t, path)
        index = len(self.entries)
        shape = tuple(t.shape)
        dtype = t.dtype
        numel = t.numel()
        device, address, stride, lazy = t.get_device(), t.data_ptr(), t.stride(), (t.is_conj(), t.is_neg())
        self.record.append((address, shape, stride, dtype, t.device, *lazy))  # as _tensor_record, read once
        alias = None
        if numel > 0 and not address:
            raise UsageError(f"{path}: this {type(t).__name__} holds no data of its own (a wrapper tensor "
                             "subclass)", hint="save the plain tensors it wraps, or convert it to a plain tensor")
        if numel > 0:
            # Tied weights: the same first byte, layout and dtype on the same device, and the same lazy
            # conjugate/negative bits (c.conj() shares c's bytes but not its values: checked only on a
            # match, off the common path).
            identity = (device, address, shape, stride, dtype)
            alias = self._seen.setdefault(identity, index)
            if alias == index:
                alias = None
            else:
                first = self.tensors[alias]
                if lazy != (first.is_conj(), first.is_neg()):
                    alias = None
        name = _DTYPE_NAMES.get(dtype)
        if name is None:
            name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
        self.entries.append((index, path, name, shape, numel * t.element_size(), alias))
        tensors = self.tensors
        tensors.append(t)
        tensors.addresses.append(address)
        tensors.routes.append(route_for(t, device, lazy != (False, False)))
        return index


class Relayout(Flattener):
    """The walk of a state_dict laid out as one planned before: it makes what differs from save to save,
    the skeleton (plain values: the step, the learning rate), the module metadata, the tensors in
    order, and the record that tells whether the layout is that one. Of each tensor nothing beyond
    the record: no entry, refusal, address or route (the plan has them)."""

    def _tensor(self, t: Any, path: str) -> int:
        self.record.append(_tensor_record(t))
        self.tensors.append(t)
        return len(self.tensors) - 1


def _tensor_record(t: Any) -> tuple:
    """What the layout depends on of tensor ``t``: its size, aliasing and staging route (its type and
    requires_grad go into the skeleton, made anew by every walk)."""
    return (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device, t.is_conj(), t.is_neg())


def _torch_of(array: np.ndarray) -> Any:
    """A uint8 tensor over ``array``'s memory (read-only memory too: saving only reads it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "The given NumPy array is not writable"
        return _torch().from_numpy(array)


def _tensor_node(index: int, t: Any) -> dict:
    node: dict[str, Any] = {"__tensor__": index}
    if t is None:
        return node
    if t.requires_grad:
        node["__requires_grad__"] = True
    if type(t) is not _torch().Tensor and isinstance(t, _torch().nn.Parameter):
        node["__parameter__"] = True
    return node


def _sequence_node(value: list | tuple, items: list) -> dict:
    if isinstance(value, list):
        return {"__list__": items}
    return {"__tuple__": items} if type(value) is tuple else {"__tuple__": items, **_tuple_class(type(value))}


def _refuse(t: Any, path: str) -> NoReturn:
    if t.is_quantized:
        raise UsageError(f"{path}: quantized tensors are not supported", hint="dequantize first")
    if t.is_meta:
        raise UsageError(f"{path}: meta tensors hold no data and cannot be saved")
    raise UsageError(f"{path}: {t.layout} tensors are not supported", hint="convert with .to_dense() first")


@functools.cache
def _torch() -> Any:
    import torch  # only reached with a tensor in hand

    return torch


def encode_metadata(items: list) -> list | None:
    """An OrderedDict's ``_metadata`` items (``Module.state_dict()``: ``{prefix: {"version": 2}}``) as
    ``[[prefix, [[name, value], ...]], ...]``; None when it holds anything else (left out then, rather
    than failing the save over what torch keeps beside the tensors)."""
    encoded = []
    for prefix, entry in items:
        if type(prefix) is not str or type(entry) is not dict:
            return None
        pairs = [[name, value] for name, value in entry.items()]
        if not all(type(name) is str and (value is None or type(value) in (bool, int, str)) for name, value in pairs):
            return None
        encoded.append([prefix, pairs])
    return encoded


@functools.cache
def _tuple_class(kind: type) -> dict[str, Any]:
    """How a tuple subclass is recorded: its ``module:qualname``, and a namedtuple's fields."""
    recorded: dict[str, Any] = {"__class__": f"{kind.__module__}:{kind.__qualname__}"}
    fields = getattr(kind, "_fields", None)
    if isinstance(fields, tuple) and all(isinstance(f, str) for f in fields) and hasattr(kind, "_make"):
        recorded["__fields__"] = list(fields)
    return recorded


_DTYPE_NAMES: dict[Any, str] = {}
#: A tensor entry before placement: (index, key, dtype, shape, nbytes, alias_of). Plain tuples while
#: flattening: each TensorEntry is built once, placed (a frozen dataclass is slow to build).
Row = tuple[int, str, str, tuple[int, ...], int, "int | None"]


def flatten(state_dict: Any, allow_pickle: bool = False) -> Flattener:
    """``state_dict`` walked: its ``skeleton``, ``entries`` without placement, ``tensors`` in entry
    order, and the ``_metadata`` to encode ``later``. ``allow_pickle``: values of no other kind are
    pickled (else refused, naming the key)."""
    if not isinstance(state_dict, dict):
        raise UsageError(f"a state_dict must be a dict, not {type(state_dict).__name__} (torch.save takes any "
                         "object; ckptbench.save a dict)", hint="wrap it: save({'value': obj}, path)")
    f = Flattener(allow_pickle)
    f.skeleton = f.visit(state_dict, "")
    return f


def rebuild(skeleton: Any, tensors: list[Any], allow_pickle: bool = False) -> Any:
    """Invert :func:`flatten`: the state_dict of ``skeleton`` with ``tensors`` (in entry order) put back.

    Types come back as they were saved: OrderedDict (with its ``_metadata``), nn.Parameter and
    ``requires_grad``, ``torch.Size``, namedtuples and Enum members (when their class is imported, see
    :func:`_as_saved_class`), numpy arrays and scalars, bytes, sets, pathlib paths. Other dict
    subclasses come back as dicts and other tuple subclasses as tuples. One saved object comes back as
    one object (tied parameters stay tied). Pickled entries are unpickled only with ``allow_pickle``
    (else PickleNotAllowedError naming them, see :func:`pickled_paths`).
    """
    return _Rebuild(skeleton, tensors, allow_pickle).build(skeleton)


class _Rebuild:
    """:func:`rebuild`'s walk. A class, not a closure that names itself to recurse: such a closure is a
    reference cycle holding every tensor, freed only when the cyclic garbage collector runs (later, and
    billed to whatever runs then), where this is freed by reference counting once the caller drops it."""

    def __init__(self, skeleton: Any, tensors: list[Any], allow_pickle: bool) -> None:
        self.skeleton, self.tensors, self.allow_pickle = skeleton, tensors, allow_pickle
        self.made: dict[tuple[int, bool, bool], Any] = {}

    def tensor(self, node: dict) -> Any:
        t = self.tensors[node["__tensor__"]]
        if "__numpy__" in node:
            return _numpy_of(t, node["__numpy__"])
        if "__bytes__" in node:
            data = t.cpu().numpy().tobytes()
            return bytearray(data) if node["__bytes__"] == "bytearray" else data
        if "__pickle__" in node:
            if not self.allow_pickle:
                refuse_pickled(self.skeleton)
            return pickle.loads(t.cpu().numpy().tobytes())
        parameter, grad = node.get("__parameter__", False), node.get("__requires_grad__", False)
        grad = grad and (t.is_floating_point() or t.is_complex())
        if not (parameter or grad):
            return t
        key = (id(t), parameter, grad)
        if key not in self.made:
            self.made[key] = _torch().nn.Parameter(t, requires_grad=grad) if parameter else t.detach().requires_grad_()
        return self.made[key]

    def build(self, node: dict) -> Any:
        build = self.build
        if "__tensor__" in node:
            return self.tensor(node)
        if "__dict__" in node:
            items = [(_decode_value(k["__key__"]) if isinstance(k, dict) else k, build(v)) for k, v in node["__dict__"]]
            if node.get("__counter__"):
                return collections.Counter(dict(items))
            if not node.get("__ordered__"):
                return dict(items)
            ordered = collections.OrderedDict(items)
            if "__metadata__" in node:
                ordered._metadata = collections.OrderedDict(  # type: ignore[attr-defined]
                    (prefix, dict(pairs)) for prefix, pairs in node["__metadata__"])
            return ordered
        if "__list__" in node:
            return [build(v) for v in node["__list__"]]
        if "__tuple__" in node:
            items = tuple(build(v) for v in node["__tuple__"])
            return _as_saved_class(node["__class__"], node.get("__fields__"), items) if "__class__" in node else items
        return _decode_value(node["__value__"])


def _decode_value(node: Any) -> Any:
    if isinstance(node, list):
        return [_decode_value(v) for v in node]
    if isinstance(node, dict):
        if "__tuple__" in node:
            items = tuple(_decode_value(v) for v in node["__tuple__"])
            return _as_saved_class(node["__class__"], node.get("__fields__"), items) if "__class__" in node else items
        if "__float__" in node:
            return float(node["__float__"])
        if "__complex__" in node:
            return complex(node["__complex__"])
        if "__dtype__" in node:
            return _as_dtype(node["__dtype__"])
        if "__device__" in node:
            return _as_device(node["__device__"])
        if "__bytes__" in node:
            return base64.b64decode(node["__bytes__"], validate=True)
        if "__set__" in node:
            return {_decode_value(v) for v in node["__set__"]}
        if "__frozenset__" in node:
            return frozenset(_decode_value(v) for v in node["__frozenset__"])
        if "__path__" in node:
            return _as_path(node["__path__"], node["__flavour__"], node["__pure__"])
        if "__enum__" in node:
            return _as_enum(node)
    return node


def _as_dtype(name: str) -> Any:
    """The torch dtype saved by its name (``bfloat16``); a name that is none in this torch is damage."""
    dtype = getattr(_torch(), name, None)
    if not isinstance(dtype, _torch().dtype):
        raise UnknownTorchValueError(f"the checkpoint holds a torch dtype {name!r} this torch does not have",
                                     hint="load it with the torch version that saved it")
    return dtype


def _as_device(name: str) -> Any:
    """The torch device saved by its name (``cuda:1``); one this torch cannot name is damage."""
    try:
        return _torch().device(name)
    except RuntimeError as exc:
        raise UnknownTorchValueError(f"the checkpoint holds a torch device {name!r} this torch cannot name: {exc}",
                                     hint="load it with the torch version that saved it") from None


def _numpy_of(t: Any, spec: dict) -> Any:
    """The numpy array (or scalar) saved as ``t``'s bytes (checked against ``spec`` by the manifest's checks)."""
    dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
    raw = t.cpu().numpy()
    array = raw.view(dtype).reshape(shape) if raw.size else np.empty(shape, dtype)
    return array[()] if spec.get("scalar") else array


def _as_path(text: str, flavour: str, pure: bool) -> pathlib.PurePath:
    """A path as saved: pure paths as their flavour; concrete ones as ``pathlib.Path`` where the flavour is
    this system's, else as the pure path of theirs (a Windows path loaded on Linux)."""
    native = "windows" if sys.platform == "win32" else "posix"
    if not pure and flavour == native:
        return pathlib.Path(text)
    return pathlib.PureWindowsPath(text) if flavour == "windows" else pathlib.PurePosixPath(text)


def _as_enum(node: dict) -> Any:
    """The Enum member saved as ``node``, when its class is imported (looked up, never imported); else its
    value (logged), as a namedtuple whose class is not imported comes back as a plain tuple."""
    kind = _imported_class(node["__enum__"])
    if issubclass(type(kind), enum.EnumMeta):
        member = kind.__members__.get(node["__member__"])
        if member is None and "__raw__" in node:
            with contextlib.suppress(ValueError, TypeError):
                member = kind(_decode_value(node["__raw__"]))
        if member is not None:
            return member
    log.warning("the Enum %s (member %s) is not imported or has no such member: loaded as its value",
                node["__enum__"], node["__member__"])
    return _decode_value(node["__raw__"]) if "__raw__" in node else node["__member__"]


def _imported_class(name: str) -> Any:
    """The class named ``module:qualname`` if its module is imported, else None; looked up down modules and
    classes through their ``__dict__`` (no ``__getattr__`` hook or property runs, nothing is imported)."""
    module, _, qualname = name.partition(":")
    kind: Any = sys.modules.get(module)
    for part in qualname.split("."):
        kind = kind.__dict__.get(part) if issubclass(type(kind), (types.ModuleType, type)) else None
    return kind if issubclass(type(kind), type) else None


def pickled_paths(skeleton: Any) -> list[str]:
    """The keys (``a.b[0]``) of the pickled entries of ``skeleton``, in order."""
    found: list[str] = []
    _walk_pickled(skeleton, "", found)
    return found


def _walk_pickled(node: Any, path: str, found: list[str]) -> None:
    if not isinstance(node, dict):
        return
    if "__tensor__" in node:
        if node.get("__pickle__"):
            found.append(path or "<root>")
    elif "__dict__" in node:
        for key, child in node["__dict__"]:
            name = key if isinstance(key, str) else repr(_decode_value(key["__key__"]))
            _walk_pickled(child, f"{path}.{name}" if path else name, found)
    else:
        for i, child in enumerate(node.get("__list__") or node.get("__tuple__") or ()):
            _walk_pickled(child, f"{path}[{i}]", found)


def refuse_pickled(skeleton: Any) -> None:
    """PickleNotAllowedError naming the pickled entries of ``skeleton``, if it has any."""
    pickled = pickled_paths(skeleton)
    if pickled:
        shown = ", ".join(pickled[:5]) + (f" and {len(pickled) - 5} more" if len(pickled) > 5 else "")
        raise PickleNotAllowedError(
            f"the checkpoint holds {len(pickled)} pickled entr{'y' if len(pickled) == 1 else 'ies'} ({shown}); "
            "unpickling runs whatever code the checkpoint names",
            hint="pass allow_pickle=True, without weights_only=True, only for a checkpoint from a source you trust; "
                 "weights_only=False alone does not unpickle")


def _as_saved_class(name: str, fields: list[str] | None, items: tuple) -> Any:
    """``items`` as the tuple subclass they were saved as, where that is safe: a ``torch.Size`` of
    int64s, or a namedtuple whose class is imported (looked up, never imported: a manifest cannot make
    a load import code) and has the same fields. Anything else comes back as a plain tuple."""
    if name == "torch:Size":
        ok = all(type(i) is int and -2**63 <= i < 2**63 for i in items)
        return _torch().Size(items) if ok else items
    if fields is None:
        return items
    kind = _imported_class(name)
    if not (kind is not None and issubclass(kind, tuple) and getattr(kind, "_fields", None) == tuple(fields)):
        return items
    try:
        return kind._make(items)
    except (TypeError, ValueError):  # a class that no longer takes these items
        return items

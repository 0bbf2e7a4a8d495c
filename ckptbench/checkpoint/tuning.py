"""The writer's settings per target: durable mode (O_DIRECT or buffered + fdatasync), threads and block size.

``direct=None``, ``threads=None`` and ``block_size=None`` (the defaults of ``save``, ``Checkpointer`` and the
DCP Writer) mean "auto": :func:`settle` decides each from, in order,

1. the value given (always wins);
2. ``CKPTBENCH_SAVE_DIRECT``, ``CKPTBENCH_SAVE_THREADS``, ``CKPTBENCH_SAVE_BLOCK_BYTES`` (set in the environment);
3. ``CKPTBENCH_TUNE_FROM``: a ``bench`` or ``recommend`` result file (JSON) for the same mount;
4. a short measurement on the target's mount, once per mount and process (:func:`measure`): the probe
   writes ``CKPTBENCH_TUNE_PROBE_BYTES`` per trial into the checkpoint directory, both durable modes
   interleaved, then a few thread counts and block sizes, within ``CKPTBENCH_TUNE_SECONDS``; saves
   smaller than ``CKPTBENCH_TUNE_MIN_BYTES`` do not measure (they use a measurement already made, else
   the defaults), and ``CKPTBENCH_TUNE=0`` turns measuring off;
5. the defaults: O_DIRECT, ``knobs.SAVE_THREADS``, ``knobs.SAVE_BLOCK_BYTES``.

Under a launch (torchrun, srun) every rank uses rank 0's settings (:func:`settle_across`): rank 0 alone
measures, the others wait for its choice and record the same ``SaveResult.tuning``.

A buffered save also settles whether it writes from the tensors' own memory (zero-copy, no staging copy;
``checkpoint/zero_copy.py``): ``CKPTBENCH_SAVE_ZERO_COPY`` (0 or 1) where set, else yes on a network or
FUSE mount and ``ZERO_COPY_LOCAL`` on local storage (:func:`zero_copy_choice`). O_DIRECT saves are staged:
they need the aligned arena.

Once O_DIRECT is chosen, the thread sweep's default is at least :data:`DIRECT_MIN_THREADS`.
A measured choice leaves a default only for a candidate that beats it beyond the noise
(:func:`ckptbench.bench.stats.beats`: every sample faster than every sample of the default) and by at least
:data:`MATERIAL_GAIN` (median to median); anything less keeps the default. The same rule names the faster
durable mode in ``bench`` (:func:`faster_mode`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptbench import knobs, native, safeio
from ckptbench.config import MAX_BLOCK_BYTES, MAX_THREADS
from ckptbench.errors import RankFailedError, UsageError
from ckptbench.model.noise import beats, leaders
from ckptbench.storage.local_target import MountInfo, is_network, mount_of
from ckptbench.units import clipped, format_size

log = logging.getLogger(__name__)

#: Thread counts and block sizes the sweep tries beside the defaults.
THREAD_CANDIDATES = (2, 4, 8)
#: The fewest threads the sweep starts from (and keeps on a tie) once O_DIRECT is chosen: a direct
#: writer's threads wait on the device, not on a core, and each is one request in flight, so the
#: core count (``knobs.SAVE_THREADS``'s default) says little about how many the device wants; a short
#: probe on a busy host ties more often than not, and the fewer threads would then stay. DCP's
#: ``FileSystemWriter`` writes with 4 by default.
DIRECT_MIN_THREADS = 4
BLOCK_CANDIDATES = (1 << 20, 4 << 20, 16 << 20)
#: Samples per durable mode, and per thread count and block size in the sweeps. ``stats.beats`` asks every
#: sample of one to be faster than every sample of the other: between two settings that are really equal,
#: one is faster by chance with probability n!²/(2n)! for n samples a side, 1/6 at two (so two of three
#: processes on one mount could choose differently, seen here) and 1/20 at three.
REPEATS = 3
#: A measured setting replaces the default only when, beyond the noise, its median is also this much faster:
#: three samples a side (all a short sweep affords) part by chance often enough on a busy host that
#: a switch for less would follow the noise, run to run.
MATERIAL_GAIN = 1.10
#: The smallest request of a buffered read on a network or FUSE mount (``read_settings``).
NETWORK_READ_BLOCK_BYTES = 16 << 20
#: The fewest sequential streams a buffered read on a network or FUSE mount uses: such a client reads
#: ahead per open file and serves several streams at once.
NETWORK_READ_STREAMS = 4
#: The buffered cold read, as reasons name it.
COLD_BUFFERED = "buffered (after fdatasync + fadvise DONTNEED)"
#: Whether a buffered save on local block storage writes from the tensors' memory unless
#: CKPTBENCH_SAVE_ZERO_COPY says otherwise (on network and FUSE mounts it does).
ZERO_COPY_LOCAL = False
#: The first trial of each durable mode, and the share of CKPTBENCH_TUNE_SECONDS each later trial aims at:
#: about 1/32, so that on a mount slow enough for every trial to take its full share the whole measurement
#: still fits (2 modes x REPEATS writes and cold reads, then REPEATS samples of up to 4 thread counts and
#: 3 block sizes: 27 writes and 6 reads), and no sweep is cut short to its default for want of time.
FIRST_TRIAL_BYTES = 4 << 20
TRIAL_SHARE = 1 / 32
_PROBE_SEED = 0x74756E65


def durable_default(fstype: str | None) -> bool:
    """The durable mode a tie keeps (True: O_DIRECT): O_DIRECT on local block storage; buffered + fdatasync on a
    network or FUSE filesystem, where O_DIRECT can make every request a synchronous round trip."""
    return not is_network(fstype)


def check_direct(direct: Any) -> bool | None:
    """``direct`` as given when it is None, True or False; anything else is a TypeError."""
    if direct is None or isinstance(direct, bool):
        return direct
    raise TypeError(f"direct must be None (auto), True or False, not {direct!r}")


@dataclass(frozen=True)
class Choice:
    """One setting: its value, where it came from ("given", "settings", "result file", "measured",
    "default") and why."""

    value: Any
    source: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source, "reason": self.reason}


@dataclass(frozen=True)
class Tuning:
    """The settings of a save and why (``SaveResult.tuning`` is its :meth:`to_dict`)."""

    direct: Choice
    threads: Choice
    block_size: Choice
    mount: str | None = None
    fstype: str | None = None
    #: The probe's samples (GB/s) where it ran: per durable mode, per thread count, per block size.
    measured: dict[str, Any] = field(default_factory=dict)
    #: O_DIRECT for cold reads (loads), where measured.
    read_direct: Choice | None = None
    #: Under a launch: who settled it for every rank (``settle_across``); None in one process.
    decided_by: str | None = None
    #: Whether a sync save writes from the tensors' own memory (``zero_copy_choice``); None for object stores.
    zero_copy: Choice | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"direct": self.direct.to_dict(), "threads": self.threads.to_dict(),
               "block_size": self.block_size.to_dict(), "mount": self.mount, "fstype": self.fstype,
               "network": is_network(self.fstype), "measured": self.measured,
               "read_direct": self.read_direct.to_dict() if self.read_direct else None,
               "zero_copy": self.zero_copy.to_dict() if self.zero_copy else None}
        if self.decided_by is not None:
            out["decided_by"] = self.decided_by
        return out


def zero_copy_choice(direct: bool, fstype: str | None) -> Choice:
    """Whether a sync save with durable mode ``direct`` to a filesystem of type ``fstype`` writes its
    shards from the tensors' own memory: never with O_DIRECT (it needs the aligned staging arena);
    else ``CKPTBENCH_SAVE_ZERO_COPY`` (0 or 1) where set; else on a network or FUSE mount, where the
    copy is CPU taken from the client that moves the bytes, and ``ZERO_COPY_LOCAL`` elsewhere."""
    if direct:
        return Choice(False, "default", "O_DIRECT writes from the aligned staging arena")
    raw = os.environ.get("CKPTBENCH_SAVE_ZERO_COPY")
    if raw is not None:
        if raw not in ("0", "1"):
            raise UsageError(f"CKPTBENCH_SAVE_ZERO_COPY={raw!r} must be 0 or 1")
        return Choice(raw == "1", "settings", "CKPTBENCH_SAVE_ZERO_COPY")
    if is_network(fstype):
        return Choice(True, "default", "buffered writes on a network or FUSE mount: from the tensors' own memory, "
                                       "no staging copy")
    if ZERO_COPY_LOCAL:
        return Choice(True, "default", "buffered writes on local storage: from the tensors' own memory, no staging copy")
    return Choice(False, "default", "buffered writes on local storage: staged, the default there "
                                    "(CKPTBENCH_SAVE_ZERO_COPY=1 writes from the tensors' memory)")


def faster_mode(direct_gbps: Sequence[float], buffered_gbps: Sequence[float], *,
                default: bool = True, buffered: str = "buffered + fdatasync") -> tuple[bool, str]:
    """The durable mode to use (True: O_DIRECT) from samples of both, and why. The other mode than
    ``default`` is taken only when it beats it beyond the noise (``stats.beats``); else the default.
    ``buffered`` names the buffered mode in the reason."""
    shown = {True: "O_DIRECT", False: buffered}
    runs = {True: list(direct_gbps), False: list(buffered_gbps)}
    other = not default

    def med(values: list[float]) -> str:
        return f"{sorted(values)[len(values) // 2]:.3f} GB/s" if values else "-"

    both = f"O_DIRECT {med(runs[True])}, {buffered} {med(runs[False])}"
    if beats(runs[other], runs[default]):
        if _material(runs[other], runs[default]):
            return other, f"{shown[other]} faster beyond the noise ({both})"
        return default, (f"{shown[other]} faster by less than {MATERIAL_GAIN - 1:.0%} ({both}): {shown[default]}, "
                         "the default here")
    if beats(runs[default], runs[other]):
        return default, f"{shown[default]} faster beyond the noise ({both})"
    return default, f"tied within the noise ({both}): {shown[default]}, the default here"


def _median(values: Sequence[float]) -> float:
    return float(sorted(values)[len(values) // 2])


def _material(faster: Sequence[float], default: Sequence[float]) -> bool:
    """Whether ``faster``'s median gains at least :data:`MATERIAL_GAIN` over ``default``'s."""
    return _median(faster) >= MATERIAL_GAIN * _median(default)


def pick(candidates: dict[Any, Sequence[float]], default: Any) -> tuple[Any, str]:
    """The candidate (thread count, block size) to use: the best median if it beats ``default`` beyond
    the noise, else ``default``; and why."""
    keys = list(candidates)
    top = [keys[i] for i in leaders([list(candidates[k]) for k in keys])]
    shown = ", ".join(f"{k}: {sorted(v)[len(v) // 2]:.3f}" for k, v in candidates.items())
    if default in candidates and default in top:
        return default, f"the default ties with the best ({shown} GB/s)"
    if default not in candidates:
        return top[0], f"best median ({shown} GB/s)"
    if not _material(candidates[top[0]], candidates[default]):
        return default, f"the best gains less than {MATERIAL_GAIN - 1:.0%} over the default ({shown} GB/s)"
    return top[0], f"faster than the default {default} beyond the noise ({shown} GB/s)"


# -- the per-process cache ------------------------------------------------------------------------

_cache: dict[tuple[str, str], Tuning] = {}
_cache_lock = threading.Lock()


def cached(mount: MountInfo | None) -> Tuning | None:
    """The measurement made for ``mount`` in this process, if any."""
    if mount is None:
        return None
    with _cache_lock:
        return _cache.get((mount.mount_point, mount.device))


def remember(mount: MountInfo, tuning: Tuning) -> None:
    with _cache_lock:
        _cache[(mount.mount_point, mount.device)] = tuning


def forget() -> None:
    """Drop every cached measurement (the next auto save measures again)."""
    with _cache_lock:
        _cache.clear()


# -- settings and result files --------------------------------------------------------------------

def _from_settings() -> dict[str, Choice]:
    """The settings ``CKPTBENCH_SAVE_DIRECT``/``_THREADS``/``_BLOCK_BYTES`` set in the environment."""
    out: dict[str, Choice] = {}
    raw = os.environ.get("CKPTBENCH_SAVE_DIRECT")
    if raw is not None:
        if raw not in ("0", "1"):
            raise UsageError(f"CKPTBENCH_SAVE_DIRECT={raw!r} must be 0 or 1")
        out["direct"] = Choice(raw == "1", "settings", "CKPTBENCH_SAVE_DIRECT")
    if "CKPTBENCH_SAVE_THREADS" in os.environ:
        out["threads"] = Choice(knobs.SAVE_THREADS, "settings", "CKPTBENCH_SAVE_THREADS")
    if "CKPTBENCH_SAVE_BLOCK_BYTES" in os.environ:
        out["block_size"] = Choice(knobs.SAVE_BLOCK_BYTES, "settings", "CKPTBENCH_SAVE_BLOCK_BYTES")
    return out


def from_result(document: dict[str, Any], where: str) -> dict[str, Choice]:
    """The writer settings a ``bench`` (filesystem sweep) or ``recommend`` result names. Each is checked
    as a caller's value would be (threads 1..``MAX_THREADS``, a block size 1..``MAX_BLOCK_BYTES``,
    direct true or false): UsageError naming the file and the value otherwise."""
    out: dict[str, Choice] = {}
    if isinstance(document.get("settings"), dict):  # recommend
        settings = document["settings"]
        for key, name in (("threads", "threads"), ("block_size_bytes", "block_size"), ("direct", "direct")):
            entry = settings.get(key, {})
            if not isinstance(entry, dict):
                raise UsageError(f"{where}: settings.{key} is {clipped(entry)}, not {{'value': ..., 'reason': ...}}")
            value = entry.get("value")
            if value is not None:
                reason = entry.get("reason")
                out[name] = Choice(_checked_setting(name, value, where), "result file",
                                   f"{where}: {reason if isinstance(reason, str) else 'recommended'}")
        return out
    results = document.get("results")
    if not isinstance(results, list) or not results or not isinstance(results[0], dict) \
            or "config" not in results[0]:
        raise UsageError(f"{where}: neither a bench filesystem result nor a recommendation",
                         hint="give the JSON file `ckptbench bench DIR --json` or `ckptbench recommend --json` wrote")
    index = document.get("best", 0)
    if type(index) is not int or not 0 <= index < len(results) or not isinstance(results[index], dict) \
            or not isinstance(results[index].get("config"), dict):
        raise UsageError(f"{where}: best is {clipped(index)}, not the index of one of its {len(results)} results "
                         "with a config")
    best = results[index]
    config = best["config"]
    why = f"{where}: the fastest configuration measured there"
    out["threads"] = Choice(_checked_setting("threads", config.get("threads"), where), "result file", why)
    out["block_size"] = Choice(_checked_setting("block_size", config.get("block_size"), where), "result file", why)
    modes = best.get("durable_modes")
    if isinstance(modes, dict) and isinstance(modes.get("write_direct"), bool):
        reason = modes.get("write_reason")
        out["direct"] = Choice(modes["write_direct"], "result file",
                               f"{where}: {reason if isinstance(reason, str) else ''}")
    else:
        out["direct"] = Choice(_checked_setting("direct", config.get("direct"), where), "result file", why)
    return out


def _checked_setting(name: str, value: Any, where: str) -> Any:
    """``value`` of the writer setting ``name`` from the result file ``where``, if it is one a caller may give."""
    if name == "direct":
        if type(value) is not bool:
            raise UsageError(f"{where}: direct is {clipped(value)}, not true or false")
        return value
    high = MAX_THREADS if name == "threads" else MAX_BLOCK_BYTES
    if type(value) is not int or not 1 <= value <= high:
        raise UsageError(f"{where}: {name} is {clipped(value)}, not a whole number from 1 to {high}")
    return value



def _result_file(mount: MountInfo | None) -> dict[str, Choice]:
    path = os.environ.get("CKPTBENCH_TUNE_FROM")
    if not path:
        return {}
    try:  # a regular file, not through a symlink, and capped: never a FIFO that hangs the save or /dev/zero
        document = json.loads(safeio.read_text(path, safeio.MAX_RESULT_BYTES, "result file"))
    except UsageError as exc:  # UnsafeFileError: a symlink, FIFO, device or oversized file
        raise UsageError(f"CKPTBENCH_TUNE_FROM={path}: {exc}") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise UsageError(f"CKPTBENCH_TUNE_FROM={path}: cannot read it as a result file ({exc})") from None
    if not isinstance(document, dict):
        raise UsageError(f"CKPTBENCH_TUNE_FROM={path}: not a result document")
    target = document.get("target")
    if mount is not None and isinstance(target, str) and os.path.isabs(target):
        theirs = mount_of(Path(target))
        if theirs is not None and theirs.mount_point != mount.mount_point:
            log.info("CKPTBENCH_TUNE_FROM=%s measured %s, another mount than %s: not used", path, target,
                     mount.mount_point)
            return {}
    return from_result(document, path)


# -- the measurement ------------------------------------------------------------------------------

class _Probe:
    """Timed durable writes of ``nbytes`` (one file per ``files``) into ``store``'s directory, each read
    back cold in the same mode (O_DIRECT, or buffered after fdatasync + fadvise DONTNEED), then removed."""

    def __init__(self, store: Any, nbytes: int, files: int) -> None:
        self.store, self.files = store, files
        self.per_file_max = self.fit(nbytes)
        self.buffer = native.AlignedBuffer(self.per_file_max * files)
        native.fill_random(self.buffer, _PROBE_SEED)
        self.sink = native.AlignedBuffer(self.per_file_max * files)
        native.fill_random(self.sink, _PROBE_SEED + 1)
        self.nbytes = self.per_file_max * files
        self.fallback: str | None = None

    def fit(self, nbytes: float) -> int:
        """Bytes per file of a trial of about ``nbytes`` in all: aligned, at least one alignment unit."""
        align = knobs.ALIGNMENT_BYTES
        per_file = max(align, int(nbytes) // self.files // align * align)
        return min(per_file, getattr(self, "per_file_max", per_file))

    def write(self, *, direct: bool, threads: int, block_size: int, read: bool = False,
              nbytes: float | None = None) -> tuple[float, float]:
        """GB/s of one durable write of ``nbytes`` (default: the probe's size; files fdatasynced, the
        directory fsynced), and of its cold read-back (0 when ``read`` is False)."""
        per_file = self.fit(self.nbytes if nbytes is None else nbytes)
        view, sink = memoryview(self.buffer), memoryview(self.sink)
        views = [view[i * per_file:(i + 1) * per_file] for i in range(self.files)]
        sinks = [sink[i * per_file:(i + 1) * per_file] for i in range(self.files)]
        total = per_file * self.files
        tag = secrets.token_hex(3)
        names = [f".ckptbench-tune-{tag}-{i}" for i in range(self.files)]
        read_s = 0.0
        t0 = time.perf_counter()
        try:
            report = self.store.write_files(list(zip(names, views, strict=True)), threads=threads,
                                            block_size=block_size, direct=direct)
            write_s = time.perf_counter() - t0
            if read:
                t1 = time.perf_counter()
                self.store.read_files(list(zip(names, sinks, strict=True)), threads=threads,
                                      block_size=block_size, direct=direct and report.direct)
                read_s = time.perf_counter() - t1
        finally:
            self.store.remove(names)
        if direct and not report.direct:
            self.fallback = report.fallback_reason or "O_DIRECT not available"

        def gbps(seconds: float) -> float:
            return total / seconds / 1e9 if seconds > 0 else 0.0

        return gbps(write_s), gbps(read_s)


def measure(store: Any, mount: MountInfo, total_bytes: int, shard_size: int, *,
            default_threads: int, default_block: int) -> Tuning:
    """Measure the durable modes, then thread counts and block sizes, on ``store``'s mount (bounded by
    ``CKPTBENCH_TUNE_PROBE_BYTES`` per trial and ``CKPTBENCH_TUNE_SECONDS`` in all)."""
    deadline = time.perf_counter() + knobs.TUNE_SECONDS
    files = max(1, min(4, -(-total_bytes // max(1, shard_size))))
    probe = _Probe(store, min(knobs.TUNE_PROBE_BYTES, max(total_bytes, 1 << 20)), files)
    where = f"{mount.mount_point} ({mount.fstype}, {format_size(probe.nbytes)} probe)"
    measured: dict[str, Any] = {"probe_bytes": probe.nbytes, "files": files}

    # Each trial's size follows the rate its mode showed, for about TRIAL_SHARE of the budget, so that
    # a mode that runs at a few MB/s (O_DIRECT over FUSE can) still gets its samples in time.
    trial_s = knobs.TUNE_SECONDS * TRIAL_SHARE
    size = {True: min(probe.nbytes, FIRST_TRIAL_BYTES), False: min(probe.nbytes, FIRST_TRIAL_BYTES)}
    runs: dict[bool, list[float]] = {True: [], False: []}
    reads: dict[bool, list[float]] = {True: [], False: []}
    for repeat in range(REPEATS):
        for mode in (True, False):
            if mode and probe.fallback:
                continue
            w, r = probe.write(direct=mode, threads=default_threads, block_size=default_block, read=True,
                               nbytes=size[mode])
            size[mode] = w * 1e9 * trial_s
            if not (mode and probe.fallback):
                runs[mode].append(w)
                reads[mode].append(r)
        if repeat >= 1 and time.perf_counter() > deadline:
            break
    measured.update(direct_gbps=runs[True], buffered_gbps=runs[False], direct_read_gbps=reads[True],
                    buffered_read_gbps=reads[False])
    if probe.fallback:
        why = f"O_DIRECT probe failed on {where} ({probe.fallback}): buffered + fdatasync, as before"
        direct = Choice(False, "measured", why)
        read_direct = Choice(False, "measured", why)
    else:
        default = durable_default(mount.fstype)
        value, why = faster_mode(runs[True], runs[False], default=default)
        direct = Choice(value, "measured", f"{where}: writes: {why}")
        value, why = faster_mode(reads[True], reads[False], default=default, buffered=COLD_BUFFERED)
        read_direct = Choice(value, "measured", f"{where}: cold reads: {why}")

    nbytes = size[direct.value]
    if direct.value:
        default_threads = max(default_threads, DIRECT_MIN_THREADS)
    threads = _sweep(probe, "threads", THREAD_CANDIDATES, default_threads, deadline, measured,
                     lambda n: probe.write(direct=direct.value, threads=n, block_size=default_block, nbytes=nbytes)[0],
                     where)
    block = _sweep(probe, "block_size", BLOCK_CANDIDATES, default_block, deadline, measured,
                   lambda b: probe.write(direct=direct.value, threads=threads.value, block_size=b, nbytes=nbytes)[0],
                   where)
    tuning = Tuning(direct, threads, block, mount.mount_point, mount.fstype, measured, read_direct)
    log.info("tuned %s: direct=%s threads=%d block=%s (%s)", mount.mount_point, direct.value, threads.value,
             format_size(block.value), direct.reason)
    return tuning


def _sweep(probe: _Probe, name: str, candidates: Sequence[int], default: int, deadline: float,
           measured: dict[str, Any], trial: Any, where: str) -> Choice:
    values = list(dict.fromkeys([default, *candidates]))
    if name == "block_size":
        values = [v for v in values if v <= probe.per_file_max]
    samples: dict[int, list[float]] = {v: [] for v in values}
    for _ in range(REPEATS):
        for value in values:
            if time.perf_counter() > deadline:
                break
            samples[value].append(trial(value))
    samples = {k: v for k, v in samples.items() if v}
    measured[f"{name}_gbps"] = {str(k): v for k, v in samples.items()}
    if len(samples) < 2 or default not in samples:
        return Choice(default, "default", f"no time left to compare {name} on {where} (CKPTBENCH_TUNE_SECONDS)")
    if min(len(v) for v in samples.values()) < REPEATS:  # fewer samples would leave the default by chance
        shown = ", ".join(f"{k}: {_median(v):.3f}" for k, v in samples.items())
        return Choice(default, "default", f"{where}: no time for {REPEATS} samples of every {name} "
                                          f"(CKPTBENCH_TUNE_SECONDS), the default kept ({shown} GB/s)")
    value, why = pick(samples, default)
    return Choice(value, "measured", f"{where}: {why}")


# -- the entry points -----------------------------------------------------------------------------

def _defaults(default_threads: int, default_block: int, why: str) -> dict[str, Choice]:
    return {"direct": Choice(True, "default", why), "threads": Choice(default_threads, "default", why),
            "block_size": Choice(default_block, "default", why)}


def settle(store: Any, *, direct: bool | None, threads: int | None, block_size: int | None, total_bytes: int,
           shard_size: int, may_measure: bool = True) -> Tuning:
    """The settings of one save to ``store`` (see the module's docstring for the order of sources)."""
    default_threads, default_block = knobs.SAVE_THREADS, knobs.SAVE_BLOCK_BYTES
    given = {k: Choice(v, "given", "given by the caller")
             for k, v in (("direct", direct), ("threads", threads), ("block_size", block_size)) if v is not None}
    local = store.local_path
    mount = mount_of(Path(local)) if local is not None else None
    fstype = mount.fstype if mount else None
    point = mount.mount_point if mount else None
    if len(given) == 3:
        return Tuning(given["direct"], given["threads"], given["block_size"], point, fstype,
                      zero_copy=zero_copy_choice(given["direct"].value, fstype))
    if local is None:
        base = _defaults(default_threads, default_block, "object store: the defaults")
        return Tuning(**{**base, **_from_settings(), **given}, mount=None, fstype=None)
    base = _defaults(default_threads, default_block, "the defaults")
    settings = {**_result_file(mount), **_from_settings()}
    measured: dict[str, Any] = {}
    read_direct: Choice | None = None
    if len({**settings, **given}) < 3 and mount is not None:
        found = cached(mount)
        if found is None and may_measure and knobs.TUNE and total_bytes >= knobs.TUNE_MIN_BYTES:
            start = {**base, **settings, **given}  # the measurement starts from the values that win anyway
            found = measure(store, mount, total_bytes, shard_size, default_threads=start["threads"].value,
                            default_block=start["block_size"].value)
            remember(mount, found)
        if found is not None:
            base = {"direct": found.direct, "threads": found.threads, "block_size": found.block_size}
            measured, read_direct = found.measured, found.read_direct
        elif not knobs.TUNE:
            base = _defaults(default_threads, default_block, "CKPTBENCH_TUNE=0: the defaults")
        elif total_bytes < knobs.TUNE_MIN_BYTES:
            base = _defaults(default_threads, default_block, f"save below CKPTBENCH_TUNE_MIN_BYTES "
                             f"({format_size(knobs.TUNE_MIN_BYTES)}) and no measurement of this mount yet: the defaults")
    chosen = {**base, **settings, **given}
    return Tuning(chosen["direct"], chosen["threads"], chosen["block_size"], point, fstype, measured, read_direct,
                  zero_copy=zero_copy_choice(chosen["direct"].value, fstype))


def settle_across(world: Any, key: str, store: Any, *, direct: bool | None, threads: int | None,
                  block_size: int | None, total_bytes: int, shard_size: int, failed_key: str) -> Tuning:
    """The settings of one save under a launch: every rank uses rank 0's. Rank 0 settles them as a save
    from one process does (measuring its mount once per process when it must, while the other ranks
    wait: ranks probing at once would measure each other) and publishes them under ``key``; the
    others take them and cache rank 0's measurement for their own mount, so that their loads read
    the way rank 0's do. Rank 0 publishes its failure under ``failed_key`` instead (the save's
    outcome): the others then raise RankFailedError at once. With every setting given, or an object
    store (nothing to measure), each rank settles alone: the result is the same everywhere."""
    alone = dict(direct=direct, threads=threads, block_size=block_size, total_bytes=total_bytes,
                 shard_size=shard_size)
    if store.local_path is None or None not in (direct, threads, block_size):
        return settle(store, may_measure=False, **alone)
    by = f"rank 0 of {world.world_size}"
    if world.is_first:
        chosen = dataclasses.replace(settle(store, **alone), decided_by=by)
        local = store.local_path
        world.publish(key, (chosen, cached(mount_of(Path(local)))))
        return chosen
    what = f"waiting for rank 0's writer settings for {store.url}"
    if world.wait_for_any([key, failed_key], what=what) == failed_key:
        outcome = world.wait_for(failed_key, readers=world.world_size - 1, what=what)
        raise RankFailedError(f"rank {world.rank}: {store.url} was not committed: {outcome['failed']}")
    chosen, measurement = world.wait_for(key, readers=world.world_size - 1, what=what)
    mount = mount_of(Path(store.local_path))
    if measurement is not None and mount is not None:
        remember(mount, measurement)
    return chosen


def read_mode(store: Any, direct: bool | None) -> bool:
    """O_DIRECT for a load: ``direct`` when given, else the cold-read mode this process measured for the
    mount (faster beyond the noise, else O_DIRECT), else O_DIRECT."""
    if direct is not None:
        return direct
    local = store.local_path
    found = cached(mount_of(Path(local))) if local is not None else None
    return True if found is None or found.read_direct is None else bool(found.read_direct.value)


def read_settings(store: Any, direct: bool | None, threads: int, block_size: int) -> dict[str, Any]:
    """``direct``, ``threads`` and ``block_size`` for a load's read of shards (``read_mode``). Buffered
    reads on a network or FUSE mount read in sequential streams (the store gives each thread a contiguous
    part of one file, through a descriptor of its own), at least ``NETWORK_READ_STREAMS`` of them, of
    requests of at least ``NETWORK_READ_BLOCK_BYTES``."""
    mode = read_mode(store, direct)
    local = store.local_path
    mount = mount_of(Path(local)) if local is not None and not mode else None
    if mount is not None and is_network(mount.fstype):
        threads, block_size = max(threads, NETWORK_READ_STREAMS), max(block_size, NETWORK_READ_BLOCK_BYTES)
    return {"direct": mode, "threads": threads, "block_size": block_size}

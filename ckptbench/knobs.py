"""Internal constants, each overridable by a ``CKPTBENCH_*`` environment variable.

User settings live in TOML configs and CLI flags (``config.py``); these are the tool's own tuning
values. Every override is logged at INFO level so a run records what it changed.
"""

from __future__ import annotations

import logging
import math
import os

from ckptbench.errors import SettingError

log = logging.getLogger(__name__)


def _env_int(name: str, default: int, low: int | None = None, high: int | None = None, *,
             zero: bool = False) -> int:
    """``CKPTBENCH_<name>`` as an integer (decimal, or 0x/0o/0b), else ``default``. A value outside
    ``[low, high]`` (0 too with ``zero``: "off" or "automatic") raises :class:`SettingError`."""
    raw = os.environ.get(f"CKPTBENCH_{name}")
    if raw is None:
        return default
    try:
        value = int(raw, 0)
    except ValueError:
        raise SettingError(f"CKPTBENCH_{name}={raw!r} is not an integer") from None
    if not (zero and value == 0):
        _check_range(name, raw, value, low, high, zero)
    log.info("knob CKPTBENCH_%s=%d (default %d)", name, value, default)
    return value


def _env_float(name: str, default: float, low: float | None = None, high: float | None = None) -> float:
    """``CKPTBENCH_<name>`` as a finite number, else ``default``; outside ``[low, high]``: :class:`SettingError`."""
    raw = os.environ.get(f"CKPTBENCH_{name}")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"CKPTBENCH_{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise SettingError(f"CKPTBENCH_{name}={raw!r} is not a finite number")
    _check_range(name, raw, value, low, high, False)
    log.info("knob CKPTBENCH_%s=%g (default %g)", name, value, default)
    return value


def _check_range(name: str, raw: str, value: float, low: float | None, high: float | None, zero: bool) -> None:
    if (low is None or value >= low) and (high is None or value <= high):
        return
    def shown(v: float) -> str:
        return str(v) if isinstance(v, int) else f"{v:g}"

    bounds = (f"from {shown(low)} to {shown(high)}" if low is not None and high is not None else
              f"at least {shown(low)}" if low is not None else f"at most {shown(high)}")
    raise SettingError(f"CKPTBENCH_{name}={raw!r} is out of range: give {'0 or ' if zero else ''}a value {bounds}")


#: Switches: 0 off, 1 on.
_OFF, _ON = 0, 1
#: The smallest part S3 takes in a multipart upload (all but the last) and the largest.
_S3_PART_MIN, _S3_PART_MAX = 5 * 2**20, 5 * 2**30


#: Alignment of every host buffer and of O_DIRECT offsets/lengths (bytes).
ALIGNMENT_BYTES = _env_int("ALIGNMENT_BYTES", 4096, 512)
if ALIGNMENT_BYTES & (ALIGNMENT_BYTES - 1):
    raise SettingError(f"CKPTBENCH_ALIGNMENT_BYTES={ALIGNMENT_BYTES} is not a power of two")
#: Largest source buffer the filesystem benchmark allocates; bigger files are written from it in pieces.
BENCH_BUFFER_MAX_BYTES = _env_int("BENCH_BUFFER_MAX_BYTES", 256 * 2**20, 1)
#: Bytes copied to measure memcpy bandwidth (the cache-suspicion ceiling); larger than the CPU caches.
MEMCPY_PROBE_BYTES = _env_int("MEMCPY_PROBE_BYTES", 64 * 2**20, 1)
#: A measured rate above this fraction of memcpy bandwidth is flagged as served from cache.
CACHED_FRACTION_OF_MEMCPY = _env_float("CACHED_FRACTION_OF_MEMCPY", 0.9, 0.0, 1.0)
#: Extra free space the benchmark keeps beyond what it writes (fraction of the run size).
FREE_SPACE_MARGIN = _env_float("FREE_SPACE_MARGIN", 0.05, 0.0)
#: Files written by the metadata benchmark, and their size.
METADATA_FILES = _env_int("METADATA_FILES", 2000, 1)
METADATA_FILE_BYTES = _env_int("METADATA_FILE_BYTES", 4096, 0)
#: Checkpoint writer defaults (``ckptbench.save``): I/O and copy threads, shard size, bytes per pwrite.
SAVE_THREADS = _env_int("SAVE_THREADS", max(2, min(8, os.cpu_count() or 2)), 1)
SAVE_SHARD_BYTES = _env_int("SAVE_SHARD_BYTES", 256 * 2**20, 1)
SAVE_BLOCK_BYTES = _env_int("SAVE_BLOCK_BYTES", 4 * 2**20, 4096)
#: Per-mount tuning of the writer's auto settings (``checkpoint.tuning``): 0 turns measuring off; the
#: probe's bytes per trial and its time budget in all; saves smaller than TUNE_MIN_BYTES do not measure.
TUNE = _env_int("TUNE", 1, _OFF, _ON)
TUNE_PROBE_BYTES = _env_int("TUNE_PROBE_BYTES", 32 * 2**20, 1)
TUNE_SECONDS = _env_float("TUNE_SECONDS", 5.0, 0.0)
TUNE_MIN_BYTES = _env_int("TUNE_MIN_BYTES", 64 * 2**20, 0)
#: GPU staging: CUDA tensors below this size are gathered on the device into runs of at most
#: STAGE_GATHER_RUN_BYTES (gaps up to STAGE_GATHER_MAX_GAP_BYTES), each copied to the host as one piece;
#: runs are gathered in batches of about that size into STAGE_GATHER_SLOTS device buffers, so the
#: gathering of one batch overlaps the copies of those before it (1 slot: one after the other).
STAGE_GATHER_BELOW_BYTES = _env_int("STAGE_GATHER_BELOW_BYTES", 2 * 2**20, 0)
STAGE_GATHER_RUN_BYTES = _env_int("STAGE_GATHER_RUN_BYTES", 32 * 2**20, 1)
STAGE_GATHER_SLOTS = _env_int("STAGE_GATHER_SLOTS", 3, 1)
STAGE_GATHER_MAX_GAP_BYTES = _env_int("STAGE_GATHER_MAX_GAP_BYTES", 4096, 0)
#: 1: gather small CUDA tensors with one runtime-compiled kernel launch (checkpoint/gather.py); 0: torch.cat.
STAGE_GATHER_KERNEL = _env_int("STAGE_GATHER_KERNEL", 1, _OFF, _ON)
#: 1: the gather kernel writes small tensors straight into the registered (mapped) host arena, one
#: launch for all (mapped staging, measured in results/gpu-staging-*); 0: it gathers them into device
#: buffers, then one device-to-host copy per run. CKPTBENCH_STAGE_GATHER_DIRECT is its older name.
STAGE_GATHER_MAPPED = _env_int("STAGE_GATHER_MAPPED", _env_int("STAGE_GATHER_DIRECT", 1, _OFF, _ON), _OFF, _ON)
#: Async saves stage contiguous CPU tensors copy-on-write (``checkpoint.stage.CowStaging``): the caller
#: waits only while their pages are write-protected, and the copy runs behind it (Linux 6.4+ userfaultfd);
#: 0 copies them before save() returns. The chunk is what a write to a page not yet copied waits for.
STAGE_COW = _env_int("STAGE_COW", 1, _OFF, _ON)
STAGE_COW_CHUNK_BYTES = _env_int("STAGE_COW_CHUNK_BYTES", 1 << 20, 4096)
#: The staging arena (and a Checkpointer's read buffer) is left untouched when allocated: its pages are
#: faulted in by the first copy into them, by the staging threads (behind the caller of an async save
#: staged copy-on-write), or pinned by cudaHostRegister where a GPU is. 1 touches every page on the
#: caller's thread first, inside the first save's stall.
ARENA_PREFAULT = _env_int("ARENA_PREFAULT", 0, _OFF, _ON)
#: Sync saves of contiguous CPU tensors to a directory pass through a bounded staging ring
#: (``checkpoint.ring``): this many aligned slots of this many bytes, one staged while the engine writes
#: the others, instead of an arena the size of the checkpoint (the ring is used when the checkpoint is
#: larger than it). ``into=`` loads with ``bounded_memory`` read through the same ring. STAGE_RING=0
#: stages every sync save into the whole-checkpoint arena.
STAGE_RING = _env_int("STAGE_RING", 1, _OFF, _ON)
STAGE_RING_SLOTS = _env_int("STAGE_RING_SLOTS", 4, 2)
STAGE_RING_SLOT_BYTES = _env_int("STAGE_RING_SLOT_BYTES", 64 << 20, 4096)
#: The distributed bench: the host memory its ranks on one host may hold together (0: what the host has
#: available). Below twice the ranks' shares, async saves are measured on a part of each share and scaled.
BENCH_MEMORY_BYTES = _env_int("BENCH_MEMORY_BYTES", 0, 0)
#: A Checkpointer reuses its last save's plan when the next state_dict is laid out the same way
#: (``plan.PlanCache``); 0 plans every save afresh.
PLAN_REUSE = _env_int("PLAN_REUSE", 1, _OFF, _ON)
#: preflight in one process: how far a node's rates may lie from the sample's beyond the repeats' spread,
#: as a factor either way: the job's ranks are other processes, later, often of another shape (more bytes,
#: more ranks) than was measured; it adds to the runs' own spread in quadrature on a log scale
#: (``decide/scaling.sample_allowance``, ``widen_end``).
SAMPLE_EXTRAPOLATION = _env_float("SAMPLE_EXTRAPOLATION", 1.3, 1.0)
#: preflight in one process: the most writer processes it starts at once to measure a node's ranks writing
#: together (a node with more ranks is extrapolated from this many); 1 measures one process only.
SAMPLE_RANKS_MAX = _env_int("SAMPLE_RANKS_MAX", 4, 1)
#: Outside a terminal (logs, Slurm, CI), a line on stderr as each step of a measurement starts and ends; 0: none.
LOG_PROGRESS = _env_int("LOG_PROGRESS", 1, _OFF, _ON)
#: Seconds between progress updates while a native call runs.
PROGRESS_POLL_S = _env_float("PROGRESS_POLL_S", 0.1, 0.001)
#: Distributed launches: longest wait for another rank (a barrier after the slowest rank's write),
#: the time the process group has to form, the heartbeat period, and the silence that means a rank died.
DIST_TIMEOUT_S = _env_float("DIST_TIMEOUT_S", 1800.0, 0.001)
DIST_CONNECT_TIMEOUT_S = _env_float("DIST_CONNECT_TIMEOUT_S", 60.0, 0.001)
DIST_HEARTBEAT_S = _env_float("DIST_HEARTBEAT_S", 0.5, 0.001)
DIST_DEAD_AFTER_S = _env_float("DIST_DEAD_AFTER_S", 5.0, 0.001)
#: Save lock on object stores: a lease not renewed for this long is taken over (checkpoint/lock.py).
LOCK_TTL_S = _env_float("LOCK_TTL_S", 60.0, 0.001)
#: Host memory a drain to the remote tier reads shards into: to S3, at most this many bytes of parts in flight
#: (read, waiting or uploading; at most one more than the upload workers, at least two parts); to a directory,
#: two halves (one read while the other is written).
DRAIN_BUFFER_BYTES = _env_int("DRAIN_BUFFER_BYTES", 512 * 2**20, 1)
#: Seconds before a failed drain is tried again (a new local checkpoint to drain retries at once).
DRAIN_RETRY_S = _env_float("DRAIN_RETRY_S", 30.0, 0.0)
#: Stop the drain process (SIGSTOP) while an async save of the same manager stages (training is blocked
#: then), continue it after (SIGCONT); 0 lets it run on beside the staging.
DRAIN_PAUSE = _env_int("DRAIN_PAUSE", 1, _OFF, _ON)
#: A drain that makes no progress for this many seconds (no part or batch of shards read or written, no commit:
#: a remote tier that stopped answering) is stopped (its process killed) and retried later.
DRAIN_TIMEOUT_S = _env_float("DRAIN_TIMEOUT_S", 300.0, 0.001)
#: Niceness added to a background drain's thread (and the I/O threads it starts), so that local saves'
#: staging and training win the CPU from it; 0 keeps its priority.
DRAIN_NICE = _env_int("DRAIN_NICE", 10, 0, 19)
#: A background drain's disk I/O (and its threads') in the idle class (Linux, schedulers with classes): its
#: reads of the local tier wait for local saves' writes; 0 keeps its I/O class.
DRAIN_IDLE_IO = _env_int("DRAIN_IDLE_IO", 1, _OFF, _ON)
#: Parts a drain to S3 uploads at once; 0: as many as a save to the same store sends. Fewer leave less data
#: in flight for the remote tier's servers to take in while the drain is stopped for a local save's staging.
DRAIN_UPLOADS = _env_int("DRAIN_UPLOADS", 0, 0)
#: Part size (bytes) of a drain's uploads to S3; 0: the store's ``part_size``, as a save's.
DRAIN_PART_BYTES = _env_int("DRAIN_PART_BYTES", 0, _S3_PART_MIN, _S3_PART_MAX, zero=True)
#: The DCP Writer's staging memory, shared by every Writer of a process (``integrations.dcp``): idle
#: arenas kept for the next save, at most this many, each freed after this many seconds unused.
DCP_IDLE_ARENAS = _env_int("DCP_IDLE_ARENAS", 2, 0)
DCP_ARENA_IDLE_S = _env_float("DCP_ARENA_IDLE_S", 300.0, 0.0)
#: preflight's sustained-write probe (past the write-back cache): the most it writes, the share of the
#: target's free space it may take, how long it writes under O_DIRECT (at the sample's rate) and at most.
SUSTAINED_PROBE_MAX_BYTES = _env_int("SUSTAINED_PROBE_MAX_BYTES", 4 << 30, 1)
SUSTAINED_PROBE_FREE_FRACTION = _env_float("SUSTAINED_PROBE_FREE_FRACTION", 0.25, 0.0, 1.0)
SUSTAINED_PROBE_DIRECT_S = _env_float("SUSTAINED_PROBE_DIRECT_S", 10.0, 0.001)
SUSTAINED_PROBE_MAX_S = _env_float("SUSTAINED_PROBE_MAX_S", 30.0, 0.001)
#: preflight's fresh-memory probe (a restore's new tensors faulted in): the share of the available memory it
#: may take (0: no probe) and the most seconds it runs (the rest of the node's bytes are extrapolated).
FRESH_MEMORY_SHARE = _env_float("FRESH_MEMORY_SHARE", 0.5, 0.0, 0.9)
FRESH_MEMORY_MAX_S = _env_float("FRESH_MEMORY_MAX_S", 20.0, 0.001)

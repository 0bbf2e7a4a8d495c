"""Coordination of a torch.distributed launch (torchrun, Slurm ``srun``): who we are, barriers,
exchanges that name the rank that failed.

A launch is detected from the environment: torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``; under Slurm (``srun``) ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` and
``SLURM_LOCALID`` stand in for the first three, and ``MASTER_ADDR``/``MASTER_PORT`` must still be set
(docs/commands/bench.md and docs/library.md show the usual lines). A world of one process is not a launch: everything runs as usual.

:func:`current_world` joins the launch. When the caller already has a default process group (a
training job did ``init_process_group``), ckptbench uses it and its rendezvous store; otherwise it
forms one itself: the rendezvous store with a bounded connect timeout, then a gloo group. Either way
every rank first checks in through the store, for ``DIST_CONNECT_TIMEOUT_S`` at most: a rank that never
shows up (never started, or never calls ckptbench: a save only rank 0 makes) is an error, not a hang. ckptbench's own traffic is
small control messages (paths, plans, timings, manifests); the bytes go to storage, never over the
group, so gloo serves on GPU machines too (with an nccl default group, a gloo side group is made).

Two kinds of exchange, both called by every rank in the same order:

* :meth:`World.barrier` and :meth:`World.all_gather` go through the gloo group (fast) and are for the
  calling thread of a collective step.
* :meth:`World.exchange` goes through the rendezvous store under a caller-chosen key, so it may run
  on any thread (an async save commits from a background thread while the training loop goes on);
  each rank contributes a value or its failure, and every rank gets all of them.

Failures are named. A rank that fails in ckptbench code publishes ``failed/<rank>`` with its message
before raising; a rank that dies (SIGKILL, OOM kill) stops its heartbeat (a counter in the store
bumped every ``DIST_HEARTBEAT_S``). When a collective errors (gloo reports only "connection reset")
or an exchange waits, the store is consulted and the error says which rank and why:
:class:`RankFailedError`.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import os
import pickle
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ckptbench import knobs
from ckptbench.errors import RankFailedError, UsageError
from ckptbench.interrupts import QuietThread

log = logging.getLogger(__name__)

_NAMESPACE = "ckptbench/"


@dataclass(frozen=True)
class Launch:
    """What the environment says about this process's place in a launch."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str | None
    master_port: int | None
    source: str  # "torchrun" or "slurm"

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(env: dict[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"environment variable {name}={raw!r} is not an integer") from None


def detect_launch(env: dict[str, str] | None = None) -> Launch | None:
    """The launch the environment describes, or None outside one (pure: reads ``env`` only).

    torchrun's variables win over Slurm's (``srun torchrun ...`` sets both). Raises UsageError for
    values that cannot be a launch (a rank outside the world, a port that is not a port)."""
    env = dict(os.environ if env is None else env)
    if env.get("WORLD_SIZE") is not None:
        rank, world, local = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE"), _env_int(env, "LOCAL_RANK")
        source = "torchrun"
    elif env.get("SLURM_STEP_NUM_TASKS") is not None and env.get("SLURM_PROCID") is not None:
        # SLURM_STEP_NUM_TASKS: set for the tasks of an srun step, not in the batch script itself
        # (which has SLURM_NTASKS and SLURM_PROCID=0 but is one process).
        rank, world = _env_int(env, "SLURM_PROCID"), _env_int(env, "SLURM_STEP_NUM_TASKS")
        local = _env_int(env, "SLURM_LOCALID")
        source = "slurm"
    else:
        return None
    if world is None or world < 1:
        raise UsageError(f"the launch says its world has {world} processes; it needs at least 1")
    if rank is None:
        raise UsageError(f"{'RANK' if source == 'torchrun' else 'SLURM_PROCID'} is not set but the world size is")
    if not 0 <= rank < world:
        raise UsageError(f"rank {rank} is outside a world of {world} processes")
    port = _env_int(env, "MASTER_PORT")
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"MASTER_PORT={port} is not a TCP port")
    return Launch(rank=rank, world_size=world, local_rank=local if local is not None else rank,
                  master_addr=env.get("MASTER_ADDR") or None, master_port=port, source=source)


def _describe_exception(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class World:
    """This process's view of the launch: rank, size, and the collectives ckptbench needs.

    Made by :func:`current_world`; one per process. ``timeout_s`` bounds every wait for another
    rank (a barrier after the slowest rank's write waits that long at most)."""

    def __init__(self, *, rank: int, world_size: int, local_rank: int, store: Any, group: Any,
                 timeout_s: float, owns_group: bool) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.host = socket.gethostname()
        self.timeout_s = timeout_s
        self._store = store
        self._group = group
        self._owns_group = owns_group
        self._closed = threading.Event()
        self._heartbeat = QuietThread(target=self._beat, name="ckptbench-heartbeat", daemon=True)
        self._heartbeat.start()

    def __repr__(self) -> str:
        return f"World(rank={self.rank}, world_size={self.world_size}, host={self.host!r})"

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    # -- liveness and failure reports ------------------------------------------------------------

    def _beat(self) -> None:
        try:
            store = self._store.clone()  # its own connection: never queued behind another call
        except Exception:  # noqa: BLE001 - a store that cannot clone shares the connection
            store = self._store
        while not self._closed.wait(knobs.DIST_HEARTBEAT_S):
            try:
                store.add(f"{_NAMESPACE}alive/{self.rank}", 1)
            except Exception:  # noqa: BLE001 - a blip, or the store host is gone (the next wait says so)
                continue

    def report_failure(self, what: str, exc: BaseException | str) -> None:
        """Tell the other ranks this rank failed at ``what`` and is leaving (best effort)."""
        message = exc if isinstance(exc, str) else _describe_exception(exc)
        with contextlib.suppress(Exception):
            self._store.set(f"{_NAMESPACE}failed/{self.rank}", f"{what}: {message}"[:2000])
            self._store.add(f"{_NAMESPACE}failed", 1)

    def _failures(self, ranks: list[int] | None = None) -> dict[int, str]:
        """Failure reports of ``ranks`` (default: all others); one request when there are none."""
        if not int(self._store.add(f"{_NAMESPACE}failed", 0)):
            return {}
        out: dict[int, str] = {}
        for r in range(self.world_size) if ranks is None else ranks:
            key = f"{_NAMESPACE}failed/{r}"
            if r != self.rank and self._store.check([key]):
                out[r] = self._store.get(key).decode(errors="replace")
        return out

    def _beats(self, ranks: list[int] | None = None) -> dict[int, int]:
        return {r: int(self._store.add(f"{_NAMESPACE}alive/{r}", 0))
                for r in (range(self.world_size) if ranks is None else ranks)}

    def _watched(self) -> list[int]:
        """Whose death this rank looks out for while it waits: rank 0 all, the others rank 0 (who
        exits when it sees one of them die, and that ends every collective)."""
        return [r for r in range(self.world_size) if r != self.rank] if self.is_first else [0]

    def diagnose(self) -> str:
        """Why a collective failed: the ranks that reported a failure, else the ranks whose heartbeat
        stopped over ``DIST_DEAD_AFTER_S``."""
        try:
            failures = self._failures()
            if failures:
                return "; ".join(f"rank {r} failed ({text})" for r, text in sorted(failures.items()))
            first = self._beats()
            time.sleep(knobs.DIST_DEAD_AFTER_S)
            failures = self._failures()
            if failures:
                return "; ".join(f"rank {r} failed ({text})" for r, text in sorted(failures.items()))
            second = self._beats()
        except Exception as exc:  # noqa: BLE001 - the store itself is unreachable
            return (f"rank 0 (the rendezvous store at {os.environ.get('MASTER_ADDR', '?')}:"
                    f"{os.environ.get('MASTER_PORT', '?')}) is gone ({_describe_exception(exc)})")
        dead = [r for r in second if r != self.rank and second[r] == first[r]]
        if dead:
            return f"rank{'s' if len(dead) > 1 else ''} {_ranks(dead)} stopped responding (died or hung)"
        return "no rank reported a failure; a rank may have left the collective early"

    def _raise_from(self, what: str, exc: BaseException) -> None:
        raise RankFailedError(f"rank {self.rank}: {what} failed: {self.diagnose()}",
                              hint=f"gloo said: {_describe_exception(exc)[:200]}") from None

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        """Run a part of a collective step: a ckptbench error inside is reported to the others first."""
        try:
            yield
        except RankFailedError:
            raise
        except BaseException as exc:
            self.report_failure(what, exc)
            raise

    # -- collectives on the calling thread -------------------------------------------------------

    def barrier(self, what: str = "barrier") -> None:
        """Wait for every rank; RankFailedError naming the rank that failed or died.

        The barrier runs asynchronously and is polled (0.2 ms at first, backing off to 10 ms): gloo
        notices a peer whose process ended (connection reset), but not a node that vanished, so
        the heartbeats are watched meanwhile."""
        import torch.distributed as dist

        try:
            self._await(dist.barrier(group=self._group, async_op=True), what)
        except RuntimeError as exc:
            self._raise_from(what, exc)

    def all_gather(self, value: Any, what: str = "exchange") -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order, on every rank."""
        import torch.distributed as dist

        self.barrier(what)  # object collectives cannot be polled: make sure everyone is there first
        out: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(out, value, group=self._group)
        except RuntimeError as exc:
            self._raise_from(what, exc)
        return out

    def broadcast(self, value: Any, what: str = "broadcast") -> Any:
        """Rank 0's ``value`` (picklable), on every rank."""
        import torch.distributed as dist

        self.barrier(what)
        box = [value if self.is_first else None]
        try:
            dist.broadcast_object_list(box, src=0, group=self._group)
        except RuntimeError as exc:
            self._raise_from(what, exc)
        return box[0]

    def _await(self, work: Any, what: str) -> None:
        watch = _Watch(self, what, self.timeout_s)
        poll_s, next_look = 0.0002, time.monotonic() + 0.5
        while not work.is_completed():
            time.sleep(poll_s)
            poll_s = min(0.01, poll_s * 2)
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + 0.5
                watch.look(None, self._watched(), late="not every rank arrived")
        work.wait()

    def agree(self, what: str, value: Any) -> None:
        """All ranks must hold the same ``value``; UsageError on every rank naming who differs."""
        values = self.all_gather(value, f"comparing {what}")
        if all(v == values[0] for v in values):
            return
        groups: dict[str, list[int]] = {}
        for r, v in enumerate(values):
            groups.setdefault(repr(v), []).append(r)
        listing = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {_ranks(rs)}: {v[:200]}" for v, rs in groups.items())
        raise UsageError(f"the ranks disagree on {what}: {listing}",
                         hint="every rank must be started with the same arguments")

    # -- through the store (any thread): a coordinator, rank 0, collects and decides -------------

    def gather_to_first(self, key: str, value: Any = None, *, failed: str | None = None, what: str = "",
                        timeout_s: float | None = None) -> list[Any] | None:
        """Send ``value`` (or ``failed``: this rank's failure message) to rank 0 under ``key``.

        Rank 0 gets every rank's value in rank order, or RankFailedError naming every rank that
        reported a failure, died or did not answer within ``timeout_s``; other ranks get None at
        once. Each rank calls it once per ``key``; rank 0 removes the keys after reading them."""
        base = f"{_NAMESPACE}g/{key}/"
        if not self.is_first:
            self._store.set(f"{base}{self.rank}", pickle.dumps((failed, value)))
            return None
        keys = [f"{base}{r}" for r in range(1, self.world_size)]
        try:
            self._wait_keys(keys, what or f"collecting {key!r}", timeout_s, ranks=list(range(1, self.world_size)))
            answers = [(failed, value)] + [pickle.loads(self._store.get(k)) for k in keys]
        finally:
            for k in keys:
                with contextlib.suppress(Exception):
                    self._store.delete_key(k)
        bad = {r: msg for r, (msg, _) in enumerate(answers) if msg is not None and r != 0}
        if bad:
            raise RankFailedError("; ".join(f"rank {r} failed: {msg}" for r, msg in sorted(bad.items())))
        return [v for _, v in answers]

    def publish(self, key: str, value: Any) -> None:
        """Rank 0 sets ``key`` for everyone; the others read it with :meth:`wait_for`."""
        self._store.set(f"{_NAMESPACE}p/{key}", pickle.dumps(value))

    def wait_for(self, key: str, *, readers: int | None = None, what: str = "", timeout_s: float | None = None) -> Any:
        """The value rank 0 :meth:`publish`-ed under ``key`` (RankFailedError if rank 0 dies first).
        With ``readers``, the last of that many readers removes the key."""
        full = f"{_NAMESPACE}p/{key}"
        # rank 0 may itself wait up to the timeout for the slowest rank before it answers
        timeout_s = 2 * self.timeout_s if timeout_s is None else timeout_s
        self._wait_keys([full], what or f"waiting for {key!r} from rank 0", timeout_s, ranks=[0])
        value = pickle.loads(self._store.get(full))
        if readers is not None and int(self._store.add(f"{full}#read", 1)) >= readers:
            for k in (full, f"{full}#read"):
                with contextlib.suppress(Exception):
                    self._store.delete_key(k)
        return value

    def wait_for_any(self, keys: list[str], *, what: str = "", timeout_s: float | None = None) -> str:
        """The first of ``keys`` that rank 0 has :meth:`publish`-ed, without reading it: rank 0 publishes
        the first key (a value) or another one (its failure). A helper thread blocks in the store's own
        ``wait`` for the first key (woken the moment it is set); the others are looked for every half
        second, with rank 0's failure reports and heartbeat. RankFailedError if rank 0 dies, reports a
        failure or does not answer within ``timeout_s``."""
        full = [f"{_NAMESPACE}p/{k}" for k in keys]
        what = what or f"waiting for {keys[0]!r} from rank 0"
        timeout_s = 2 * self.timeout_s if timeout_s is None else timeout_s
        done, stop = threading.Event(), threading.Event()

        def wait() -> None:
            # In slices, so that the thread is out of the store's C++ wait soon after this call returns
            # whichever way: a daemon thread still inside it when the interpreter exits aborts the process.
            try:
                own = self._store.clone()  # torch >= 2.8; older: the loop below looks every half second
                while not stop.is_set():
                    started = time.monotonic()
                    try:
                        own.wait(full[:1], datetime.timedelta(seconds=_WAIT_SLICE_S))
                        return
                    except Exception:  # noqa: BLE001 - a slice ran out, or the store is gone: the loop looks
                        if time.monotonic() - started < 0.9 * _WAIT_SLICE_S:
                            return
            except Exception:  # noqa: BLE001 - the loop below finds out what happened
                pass
            finally:
                done.set()

        helper = QuietThread(target=wait, name="ckptbench-store-wait", daemon=True)
        helper.start()
        watch = _Watch(self, what, timeout_s)
        try:
            while True:
                for key, name in zip(keys, full, strict=True):
                    if self._store.check([name]):
                        return key
                if done.is_set():  # the helper's wait ended without the first key: look every half second
                    time.sleep(0.5)
                else:
                    done.wait(0.5)
                watch.look([0], [0], late="rank 0 did not answer")
        except RankFailedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the store host (rank 0) is gone
            raise _store_gone(self.rank, what, exc) from None
        finally:
            stop.set()
            helper.join(2 * _WAIT_SLICE_S)

    def _wait_keys(self, keys: list[str], what: str, timeout_s: float | None, *, ranks: list[int]) -> None:
        """Wait until every key exists: a helper thread blocks in the store's own ``wait`` on a
        connection of its own (woken the moment the last key is set, no polling); meanwhile, every
        half second, look for a failure report of a rank still missing and, every
        ``DIST_DEAD_AFTER_S``, for one whose heartbeat stopped."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        done = threading.Event()
        errors: list[BaseException] = []

        def wait() -> None:
            try:
                try:
                    own = self._store.clone()  # torch >= 2.8
                except AttributeError:
                    own = None
                if own is not None:
                    own.wait(keys, datetime.timedelta(seconds=timeout_s + 60))
                    return
                poll_s = 0.001  # older torch: poll on the shared connection
                while not self._store.check(keys):
                    time.sleep(poll_s)
                    poll_s = min(0.05, poll_s * 2)
            except BaseException as exc:  # noqa: BLE001 - reported by the caller
                errors.append(exc)
            finally:
                done.set()

        QuietThread(target=wait, name="ckptbench-store-wait", daemon=True).start()
        watch = _Watch(self, what, timeout_s)
        try:
            while not done.wait(0.5):
                missing = [r for r, k in zip(ranks, keys, strict=True) if not self._store.check([k])] or ranks
                watch.look(missing, missing, late=f"rank{'s' if len(missing) > 1 else ''} {_ranks(missing)} "
                                                  "did not answer")
            if errors and not self._store.check(keys):
                raise errors[0]
        except RankFailedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the store host (rank 0) is gone
            raise _store_gone(self.rank, what, exc) from None

    def close(self) -> None:
        """Stop the heartbeat; destroy the process group if ckptbench made it."""
        self._closed.set()
        if self._owns_group:
            import torch.distributed as dist

            with contextlib.suppress(Exception):
                dist.destroy_process_group()


#: How long the helper thread of :meth:`World.wait_for_any` blocks in the store's wait at a time.
_WAIT_SLICE_S = 1.0


class _Watch:
    """What a wait for other ranks checks now and then: failure reports, heartbeats (a rank whose
    counter did not move over ``DIST_DEAD_AFTER_S`` is dead or hung), and the timeout."""

    def __init__(self, world: World, what: str, timeout_s: float) -> None:
        self.world, self.what, self.timeout_s = world, what, timeout_s
        self.start = time.monotonic()
        self._beats: dict[int, int] | None = None
        self._beats_at = self.start - knobs.DIST_DEAD_AFTER_S  # the first look takes a reading

    def look(self, failing: list[int] | None, beating: list[int], *, late: str) -> None:
        """RankFailedError naming a rank of ``failing`` (None: any) that reported a failure, a rank of
        ``beating`` whose heartbeat stopped, or, past the timeout, ``late``."""
        world, prefix = self.world, f"rank {self.world.rank}: {self.what}"
        try:
            failures = world._failures(failing)
            if failures:
                raise RankFailedError(f"{prefix}: " + "; ".join(
                    f"rank {r} failed ({t})" for r, t in sorted(failures.items())))
            now = time.monotonic()
            if now - self._beats_at >= knobs.DIST_DEAD_AFTER_S:
                current = world._beats(beating)
                before = self._beats or {}
                dead = [r for r in beating if r != world.rank and r in before and current[r] == before[r]]
                if dead:
                    raise RankFailedError(f"{prefix}: rank{'s' if len(dead) > 1 else ''} {_ranks(dead)} "
                                          "stopped responding (died or hung)")
                self._beats, self._beats_at = current, now
        except RankFailedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the store host (rank 0) is gone
            raise _store_gone(world.rank, self.what, exc) from None
        if time.monotonic() - self.start > self.timeout_s:
            raise RankFailedError(f"{prefix}: {late} within {self.timeout_s:g} s",
                                  hint="raise CKPTBENCH_DIST_TIMEOUT_S if the storage is that slow")


def _store_gone(rank: int, what: str, exc: BaseException) -> RankFailedError:
    return RankFailedError(f"rank {rank}: {what}: rank 0 (the rendezvous store) is gone ({_describe_exception(exc)})")


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


_world: World | None = None
_world_lock = threading.Lock()


def current_world(timeout_s: float | None = None) -> World | None:
    """The launch this process belongs to, joined on first use; None outside a launch of 2+ ranks.

    Raises RankFailedError when the process group cannot form within ``DIST_CONNECT_TIMEOUT_S``
    (a rank that never starts, a wrong MASTER_ADDR), UsageError for a launch environment that
    cannot work (no MASTER_ADDR)."""
    global _world
    with _world_lock:
        if _world is not None:
            return _world
        import torch.distributed as dist

        timeout_s = knobs.DIST_TIMEOUT_S if timeout_s is None else timeout_s
        if dist.is_available() and dist.is_initialized():
            if dist.get_world_size() < 2:
                return None
            store = dist.distributed_c10d._get_default_store()
            _check_in(store, dist.get_rank(), dist.get_world_size())
            # A group of ckptbench's own, also over a gloo default group: a save persisting on a side
            # thread must not interleave with the job's collectives.
            group = dist.new_group(backend="gloo")
            _world = World(rank=dist.get_rank(), world_size=dist.get_world_size(),
                           local_rank=int(os.environ.get("LOCAL_RANK", 0)), store=store, group=group,
                           timeout_s=timeout_s, owns_group=False)
            return _world
        launch = detect_launch()
        if launch is None or not launch.distributed:
            return None
        _world = _form(launch, timeout_s)
        # The gloo group ckptbench made is destroyed before the interpreter tears down: left to static
        # destruction, its threads abort the process now and then ("terminate called without an active
        # exception"). Async saves still in flight finish first (threading's exit hooks run before atexit's).
        atexit.register(leave_world)
        return _world


def _form(launch: Launch, timeout_s: float) -> World:
    import torch.distributed as dist

    if not launch.master_addr or launch.master_port is None:
        raise UsageError(f"a launch of {launch.world_size} ranks ({launch.source}) needs MASTER_ADDR and MASTER_PORT",
                         hint="torchrun sets them; under srun export MASTER_ADDR=<first node> MASTER_PORT=29500")
    connect = datetime.timedelta(seconds=knobs.DIST_CONNECT_TIMEOUT_S)
    where = f"{launch.master_addr}:{launch.master_port}"
    # torchrun's agent already serves the store at MASTER_PORT; elsewhere (srun) rank 0 serves it
    # and waits, at most the connect timeout, for every rank to connect.
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    try:
        store = dist.TCPStore(launch.master_addr, launch.master_port, launch.world_size,
                              launch.rank == 0 and not agent, timeout=connect, wait_for_workers=not agent)
    except Exception as exc:  # noqa: BLE001 - torch raises several types for the same thing
        raise RankFailedError(
            f"rank {launch.rank}: the process group of {launch.world_size} ranks did not form within "
            f"{knobs.DIST_CONNECT_TIMEOUT_S:g} s at {where} ({_describe_exception(exc)[:200]})",
            hint="start every rank (same MASTER_ADDR/MASTER_PORT/WORLD_SIZE); raise CKPTBENCH_DIST_CONNECT_TIMEOUT_S "
                 "if they start slowly") from None
    os.environ.setdefault("MASTER_ADDR", launch.master_addr)
    os.environ.setdefault("MASTER_PORT", str(launch.master_port))
    _check_in(store, launch.rank, launch.world_size)
    try:
        dist.init_process_group("gloo", store=store, rank=launch.rank, world_size=launch.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as exc:  # noqa: BLE001
        raise RankFailedError(f"rank {launch.rank}: the gloo process group did not form at {where} "
                              f"({_describe_exception(exc)[:200]})") from None
    log.info("joined a %s launch: rank %d of %d (local rank %d) at %s", launch.source, launch.rank,
             launch.world_size, launch.local_rank, where)
    return World(rank=launch.rank, world_size=launch.world_size, local_rank=launch.local_rank, store=store,
                 group=None, timeout_s=timeout_s, owns_group=True)


def _check_in(store: Any, rank: int, world_size: int) -> None:
    """Wait, at most ``DIST_CONNECT_TIMEOUT_S``, until every rank of the launch has come to ckptbench
    (``current_world``); else RankFailedError naming the ranks that did not.

    The collectives that form ckptbench's group (``new_group``, gloo's rendezvous in
    ``init_process_group``) wait for every rank for the process group's timeout (30 min) with no word:
    a save only rank 0 makes (``torch.save``'s ``if rank == 0:``) would hang the job that long, with
    the other ranks waiting in a collective of their own. A rank is in only once it has reached this
    point, so the collectives after it are met."""
    # torchrun's agent keeps its store across restarts of the workers: each incarnation checks in anew.
    # One counter and one key that the last rank in sets, waited for in the store (no polling: thousands of
    # ranks would each read every rank's key); a key per rank, once, names the missing ones and keeps a
    # rank that calls again (after an earlier timeout) from being counted twice.
    incarnation = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    joined = f"{_NAMESPACE}joined/{incarnation}/"
    everyone = f"{_NAMESPACE}everyone/{incarnation}"
    if not store.check([f"{joined}{rank}"]):
        store.set(f"{joined}{rank}", "1")
        if store.add(f"{joined}count", 1) >= world_size:
            store.set(everyone, "1")
    try:
        store.wait([everyone], datetime.timedelta(seconds=knobs.DIST_CONNECT_TIMEOUT_S))
        return
    except RuntimeError:  # the store's timeout (DistStoreError)
        pass
    missing = [r for r in range(world_size) if not store.check([f"{joined}{r}"])]
    if not missing:
        return
    raise RankFailedError(
        f"rank {rank}: the process group of {world_size} ranks did not form within "
        f"{knobs.DIST_CONNECT_TIMEOUT_S:g} s: rank{'s' if len(missing) > 1 else ''} {_ranks(missing)} did not "
        "call ckptbench (under a launch every rank calls save and load)",
        hint="to save or load from one rank alone (torch.save's `if rank == 0:`) pass distributed=False; "
             "raise CKPTBENCH_DIST_CONNECT_TIMEOUT_S if the other ranks only come later")


def leave_world() -> None:
    """Close the world :func:`current_world` joined (tests, and the CLI at exit)."""
    global _world
    with _world_lock:
        if _world is not None:
            _world.close()
            _world = None

"""Two tiers measured as two levels: the drain and its interference with local saves.

With the real writer and the real drain (``checkpoint/drain.py``), in rounds of four runs (a direct
save, a drain, a local save alone, a local save during a drain), each round starting one run later
than the one before (so that every run takes every place in turn, and drift in a shared machine's
load falls on all of them alike); the ratios are taken within each round:

- **drain vs direct**: the committed local checkpoint copied to the remote tier
  (``copy_checkpoint``: read, checked, written, committed) against ``ckptbench.save`` of the same
  state_dict straight to the remote tier (sync, durable); each timed from its call to its commit.
- **stall with and without a drain**: async local saves (``Checkpointer.save(async_=True)``)
  alone, and saves while a drain of the same checkpoint runs (in the drain process, at the priority
  ``CheckpointManager`` gives its drains, and stopped while a save stages as
  ``CheckpointManager.save`` stops it), the first once the drain moves data (not while its process
  starts), the next ones while it still runs; their stall (the time training is blocked) and
  persist. ``stall_saves`` saves of each kind a round (one after another), the round's figure their
  median.

Everything is written inside the two targets' scratch directories or prefixes, removed at the end
(Ctrl-C included).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from ckptbench.bench.progress import Progress
from ckptbench.bench.workloads import CheckpointWorkload, build_state_dict
from ckptbench.storage.local_target import LocalDirectory
from ckptbench.storage.store import Store, open_store


@dataclass(frozen=True)
class DrainBench:
    """The runs of one drain measurement (seconds per run; rates in GB/s = 1e9 bytes/s).

    ``runs_drain_s``: drains of the committed local checkpoint to the remote tier;
    ``runs_direct_save_s``: sync saves of the same state_dict straight to the remote tier, in the
    same rounds; ``runs_stall_alone_s``/``runs_persist_alone_s``: async local saves with no drain;
    ``runs_stall_during_s``/``runs_persist_during_s``: async local saves while a drain runs;
    ``load_by_round``: the 1-minute load average at the start of each round (0 where unknown). With
    several saves of a kind a round, the stall and persist of a round are their medians, and
    ``stalls_alone_s``/``stalls_during_s`` hold every save's stall, round after round.
    ``remote_server_here``: the remote tier's server answers on this host (its work on the drain's
    requests then runs on the CPUs the local saves stage on, and counts in their stall); None: unknown.
    """

    workload_bytes: int
    runs_drain_s: tuple[float, ...]
    runs_direct_save_s: tuple[float, ...]
    runs_stall_alone_s: tuple[float, ...]
    runs_stall_during_s: tuple[float, ...]
    runs_persist_alone_s: tuple[float, ...]
    runs_persist_during_s: tuple[float, ...]
    load_by_round: tuple[float, ...] = ()
    stalls_alone_s: tuple[float, ...] = ()
    stalls_during_s: tuple[float, ...] = ()
    remote_server_here: bool | None = None

    @property
    def drain_gbps(self) -> float:
        return self.workload_bytes / statistics.median(self.runs_drain_s) / 1e9

    @property
    def runs_drain_gbps(self) -> tuple[float, ...]:
        return tuple(self.workload_bytes / s / 1e9 for s in self.runs_drain_s)

    @property
    def direct_save_gbps(self) -> float:
        return self.workload_bytes / statistics.median(self.runs_direct_save_s) / 1e9

    @property
    def drain_vs_direct_by_round(self) -> tuple[float, ...]:
        """Drain rate / direct save rate, per round."""
        return tuple(d / s for s, d in zip(self.runs_drain_s, self.runs_direct_save_s, strict=True))

    @property
    def stall_ratio_by_round(self) -> tuple[float, ...]:
        """Stall of a local save during a drain / without one, per round."""
        return tuple(during / alone if alone > 0 else float("nan")
                     for alone, during in zip(self.runs_stall_alone_s, self.runs_stall_during_s, strict=True))

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "drain_gbps": self.drain_gbps,
            "runs_drain_gbps": list(self.runs_drain_gbps),
            "direct_save_gbps": self.direct_save_gbps,
            "drain_vs_direct": statistics.median(self.drain_vs_direct_by_round),
            "drain_vs_direct_by_round": list(self.drain_vs_direct_by_round),
            "stall_alone_s": statistics.median(self.runs_stall_alone_s),
            "stall_during_s": statistics.median(self.runs_stall_during_s),
            "stall_ratio": statistics.median(self.stall_ratio_by_round),
            "stall_ratio_by_round": list(self.stall_ratio_by_round),
        }


def server_here_note(drain: dict[str, Any]) -> str | None:
    """What a stall during a drain counts when the remote tier's server runs on this host."""
    if not drain.get("remote_server_here"):
        return None
    return ("the remote tier's server answers on this host: its work on the drain's requests runs on these CPUs "
            "and counts in the stall during a drain; with the server on another host, only the writer's own remains")


class _Place:
    """A scratch location on either kind of target: checkpoint URLs inside it and their Stores."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = storage_options or None

    def location(self, name: str) -> str:
        return f"{self.url}/{name}"

    def store(self, name: str) -> Store:
        return open_store(self.location(name), self.storage_options)


@contextlib.contextmanager
def _scratch(target: Any) -> Iterator[_Place]:
    if isinstance(target, LocalDirectory):
        with target.scratch() as path:  # the real path, not /proc/self/fd/N: the drain process opens it too
            yield _Place(os.path.realpath(path), None)
    else:
        with target.scratch() as scratch:
            yield _Place(scratch.url, target.storage_options)


def _remove(store: Store) -> None:
    store.remove(store.list())
    if store.local_path is not None:
        with contextlib.suppress(OSError):
            store.local_path.rmdir()


def run_drain_bench(workload: CheckpointWorkload, local: LocalDirectory, remote: Any, *, repeat: int = 3,
                    warmup: int = 1, threads: int | None = None, progress: Progress | None = None,
                    stall_saves: int = 1) -> DrainBench:
    """Measure the drain from ``local`` (a directory) to ``remote`` (a directory or an object target) and
    its interference with local saves, ``warmup`` discarded rounds then ``repeat`` measured ones, each
    with ``stall_saves`` local saves alone and as many during a drain (fewer when the drain ends first)."""
    from ckptbench.checkpoint.api import Checkpointer
    from ckptbench.checkpoint.drain import DrainProcess

    if stall_saves < 1:
        raise ValueError(f"stall_saves must be at least 1, got {stall_saves}")
    progress = progress or Progress()
    state_dict = build_state_dict(workload)
    runs: dict[str, list[float]] = {k: [] for k in ("drain", "direct", "stall_alone", "stall_during",
                                                    "persist_alone", "persist_during")}
    load: list[float] = []
    every: dict[str, list[float]] = {"alone": [], "during": []}
    drainer = DrainProcess()  # started by the first drain, on this thread (it lives as long as the thread)
    with _scratch(local) as here, _scratch(remote) as there, Checkpointer(threads=threads) as ckpt:
        io = {"threads": ckpt.threads, "block_size": ckpt.block_size, "direct": bool(ckpt.direct)}
        progress.phase("drain: the local checkpoint to drain")
        ckpt.save(state_dict, here.location("source"))
        source = (here.location("source"), here.storage_options)

        def drain(name: str) -> float:
            started = time.perf_counter()
            drainer.copy(source, (there.location(name), there.storage_options), step=0, **io)
            return time.perf_counter() - started

        def direct(name: str) -> float:
            started = time.perf_counter()
            ckpt.save(state_dict, there.location(name), storage_options=there.storage_options)
            return time.perf_counter() - started

        def local_save(name: str) -> tuple[float, float]:
            with drainer.paused():  # as CheckpointManager.save: the drain waits while training is blocked
                handle = ckpt.save(state_dict, here.location(name), async_=True, overwrite=True)
            result = handle.result()
            return result.stall_s, result.persist_s

        def local_saves(name: str) -> list[tuple[float, float]]:
            return [local_save(name) for _ in range(stall_saves)]

        def local_saves_during_drain(name: str, remote_name: str) -> list[tuple[float, float]]:
            failure: list[BaseException] = []

            def run() -> None:  # as CheckpointManager's drain runs: a thread waiting for the drain process
                try:
                    drain(remote_name)
                except BaseException as exc:  # noqa: BLE001 - raised below, on the caller's thread
                    failure.append(exc)

            moves = drainer.moves
            thread = threading.Thread(target=run, name="ckptbench-drain-bench", daemon=True)
            thread.start()
            try:
                while thread.is_alive() and drainer.moves < moves + 4:  # started, and data read and sent
                    time.sleep(0.005)
                saves = [local_save(name)]
                while len(saves) < stall_saves and thread.is_alive():
                    saves.append(local_save(name))
                return saves
            finally:
                thread.join()
                if failure:
                    raise failure[0]

        try:
            for n in range(warmup + repeat):
                measured = n >= warmup
                progress.phase(f"drain: round {n + 1 - warmup if measured else n + 1}"
                               f"{'' if measured else ' (warm-up)'}")
                if measured:
                    load.append(os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0)
                runs_of_round = [("direct", lambda n=n: direct(f"direct-{n}")),
                                 ("drain", lambda n=n: drain(f"drain-{n}")),
                                 ("alone", lambda: local_saves("alone")),
                                 ("during", lambda n=n: local_saves_during_drain("during", f"during-{n}"))]
                shift = n % len(runs_of_round)
                for key, run_one in runs_of_round[shift:] + runs_of_round[:shift]:
                    seconds = run_one()
                    if not measured:
                        continue
                    if key in ("direct", "drain"):
                        runs[key].append(seconds)
                    else:
                        runs[f"stall_{key}"].append(statistics.median(stall for stall, _ in seconds))
                        runs[f"persist_{key}"].append(statistics.median(persist for _, persist in seconds))
                        every[key] += [stall for stall, _ in seconds]
                for name in (f"direct-{n}", f"drain-{n}", f"during-{n}"):
                    _remove(there.store(name))
        finally:
            drainer.close()
    return DrainBench(workload_bytes=workload.total_bytes, runs_drain_s=tuple(runs["drain"]),
                      runs_direct_save_s=tuple(runs["direct"]), runs_stall_alone_s=tuple(runs["stall_alone"]),
                      runs_stall_during_s=tuple(runs["stall_during"]),
                      runs_persist_alone_s=tuple(runs["persist_alone"]),
                      runs_persist_during_s=tuple(runs["persist_during"]), load_by_round=tuple(load),
                      stalls_alone_s=tuple(every["alone"]), stalls_during_s=tuple(every["during"]),
                      remote_server_here=remote.server_on_this_host())

"""MLPerf Storage v2.0's checkpointing procedure under a distributed launch (torchrun, srun, or the ranks
``bench --mlperf`` starts on this host): every rank writes its MLPerf share (``bench.mlperf``).

Run by every rank. Order, as MLPerf's rules give it (mlcommons/storage ``Submission_guidelines.md`` v2.0,
section 2.2.2: "first perform the checkpoint write, then clear the cache, and finally perform the checkpoint
read"; ``num_checkpoints_write`` and ``num_checkpoints_read`` 10 in ``configs/dlio/workload/llama3_*.yaml``):

1. the ranks agree on the target and the options; each checks its memory, and the target its free space for
   every checkpoint at once (they all stay until the reads are done);
2. each rank builds its state_dict (its share of fp16 weights and fp32 optimizer state), untimed;
3. ``writes`` times: barrier -> every rank saves its state_dict to its own directory of checkpoint ``i``
   (durable: fsync, as MLPerf enforces) -> barrier. Each rank writes its own files, with no manifest across
   ranks, as DLIO's checkpointing does;
4. the page cache of every written checkpoint dropped once (one rank per host), then a barrier;
5. ``reads`` times: barrier -> every rank loads its own part of checkpoint ``i % writes`` -> barrier. The
   first read is verified bit-exact against the source, untimed.

A checkpoint's duration is the slowest rank's, from the barrier's exit on its own clock; its rate, all ranks'
bytes over that duration (``shootout_launched``'s rounds, aggregated as MLPerf does).
"""

from __future__ import annotations

from typing import Any

from ckptbench.bench.mlperf import MlperfProcedure, MlperfWorkload, rank_workload, run_workload
from ckptbench.bench.progress import Progress
from ckptbench.bench.shootout import required_memory_bytes
from ckptbench.bench.shootout_launched import (
    _RANK_SEED_STEP,
    DistributedBenchReport,
    DistributedBenchSpec,
    RoundResult,
    _refuse_if_short,
    _shared_places,
    _timed,
)
from ckptbench.checkpoint.api import Checkpointer
from ckptbench.checkpoint.distributed import World
from ckptbench.checkpoint.host_memory import available_memory_bytes
from ckptbench.errors import InsufficientSpaceError
from ckptbench.knobs import FREE_SPACE_MARGIN
from ckptbench.model.sizing import Parallelism
from ckptbench.storage.local_target import LocalDirectory
from ckptbench.storage.object_target import ObjectTarget
from ckptbench.units import format_size


def mlperf_spec(workload: MlperfWorkload, ranks: int, scale: float, procedure: MlperfProcedure) -> DistributedBenchSpec:
    """The run recorded as a distributed benchmark spec: MLPerf's layout, the run's bytes, the write count."""
    return DistributedBenchSpec(
        model=workload.name, size_bytes=run_workload(workload, ranks, scale).total_bytes,
        parallelism=Parallelism(dp=workload.dp, tp=workload.tp, pp=workload.pp,
                                sharding="zero3" if workload.zero == 3 else "zero1"),
        repeat=procedure.writes, warmup=0)


def run_mlperf(workload: MlperfWorkload, scale: float, procedure: MlperfProcedure,
               target: LocalDirectory | ObjectTarget, world: World, *,
               progress: Progress | None = None) -> DistributedBenchReport:
    """Run MLPerf's procedure on every rank of ``world`` (each calls this; the world's ranks are the first of
    ``workload``'s layout); every rank returns the same report, its save rounds the writes, its load rounds
    the reads. Raises UsageError on every rank when they disagree on the options or one lacks memory or
    space; RankFailedError when another rank fails."""
    from ckptbench.bench.environment import collect_environment
    from ckptbench.bench.workloads import _SEED, build_state_dict
    from ckptbench.bench.writers import verify_state_dict

    progress = progress or Progress()
    spec = mlperf_spec(workload, world.world_size, scale, procedure)
    world.agree("the target and the benchmark options",
                (str(target), workload.name, scale, procedure.to_dict()))
    whole = run_workload(workload, world.world_size, scale)
    mine = rank_workload(workload, world.rank, scale)
    per_rank = tuple(rank_workload(workload, r, scale).total_bytes for r in range(world.world_size))
    hosts = tuple(world.all_gather(world.host, "collecting host names"))
    local_ranks = hosts.count(world.host)
    first_here = hosts.index(world.host) == world.rank
    disk_bytes = int(whole.total_bytes * procedure.writes * (1 + FREE_SPACE_MARGIN)) + 64 * 2**20
    problem = None
    available = available_memory_bytes()
    need = required_memory_bytes(mine) * local_ranks
    if available is not None and need > available:
        problem = (f"{local_ranks} rank(s) on this host keep about {format_size(need)} in memory but "
                   f"{format_size(available)} is available")
    elif isinstance(target, LocalDirectory):
        try:
            target.require_free(disk_bytes)
        except InsufficientSpaceError as exc:
            problem = str(exc)
    _refuse_if_short(world, problem)
    if isinstance(target, ObjectTarget) and world.is_first:
        target.prepare()

    progress.begin(mine.total_bytes * (procedure.writes + procedure.reads))
    progress.phase(f"rank {world.rank}: building its share ({format_size(mine.total_bytes)})")
    state_dict = build_state_dict(mine, seed=_SEED + world.rank * _RANK_SEED_STEP)
    ckpt = Checkpointer()
    writes: list[RoundResult] = []
    reads: list[RoundResult] = []
    try:
        with _shared_places(target, world, disk_bytes) as places:
            checkpoints = [places.location(f"checkpoint-{i}") for i in range(procedure.writes)]
            own = [places.location(f"checkpoint-{i}/rank-{world.rank}") for i in range(procedure.writes)]
            for i in range(procedure.writes):
                progress.phase(f"write {i + 1}/{procedure.writes} ({world.world_size} ranks)")
                writes.append(_timed(world, "save", i, _write, ckpt, state_dict, own[i]))
                progress.end_step(mine.total_bytes)
            if world.local_rank == 0:
                progress.phase("dropping the page cache of every checkpoint")
                for checkpoint in checkpoints:
                    places.make_cold(checkpoint)
            world.barrier("dropping the page cache")
            for i in range(procedure.reads):
                progress.phase(f"read {i + 1}/{procedure.reads} (cold)")
                loaded: dict[str, Any] = {}
                reads.append(_timed(world, "load", i, _read, ckpt, own[i % procedure.writes], loaded))
                progress.end_step(mine.total_bytes)
                if i == 0:
                    progress.phase("verifying the first read")
                    verify_state_dict(state_dict, loaded["state_dict"], f"rank {world.rank}")
                del loaded
            world.barrier("removing the checkpoints")
            if first_here:
                for checkpoint in checkpoints:
                    places.remove(checkpoint)
            world.barrier("finishing")
            cache_drop = places.cache_drop
    finally:
        ckpt.close()
    environment = collect_environment(target.path) if isinstance(target, LocalDirectory) else collect_environment()
    launch = {"world_size": world.world_size, "source": "torch.distributed", "backend": "gloo (coordination only)",
              "local_world_size": local_ranks}
    return DistributedBenchReport(
        target=str(target), spec=spec, workload=whole, rank_bytes=per_rank, hosts=hosts,
        rounds=tuple(writes + reads), cache_drop=cache_drop, environment=environment, launch=launch)


def _write(ckpt: Checkpointer, state_dict: dict[str, Any], location: Any) -> tuple[int, float, None]:
    result = ckpt.save(state_dict, location, distributed=False)
    return result.bytes, result.stage_s + result.write_s, None  # type: ignore[union-attr]


def _read(ckpt: Checkpointer, location: Any, out: dict[str, Any]) -> tuple[int, float, None]:
    from ckptbench.bench.workloads import state_dict_bytes

    out["state_dict"] = ckpt.load(location, distributed=False)
    return state_dict_bytes(out["state_dict"]), ckpt.last_load_s, None

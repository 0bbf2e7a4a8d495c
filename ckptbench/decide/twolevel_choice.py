"""Single level or two levels, decided from measurements (``ckptbench compare --local --remote``).

Inputs: the job on each tier as ``compare`` models it (:class:`~ckptbench.bench.tier_comparison.TierResult`:
the measured rates scaled to the job, at the runs' median and at their best and worst ends), and the
measured drain (:class:`~ckptbench.bench.drain_measure.DrainBench`). The two-level schedule is the model of
``ckptbench interval`` (:mod:`ckptbench.model.twolevel`) with

- level 1: the local tier's stall and persist for the job (sync: its checkpoint time);
- level 2: drain time = the job's bytes per rank / the measured drain rate; the drain's training
  cost is the job's interference (async; the assumed one for sync jobs, whose checkpoints block);
- restarts: ``--restart`` + the restore from each tier; ``q``: ``--local-loss``.

The single-level schedule is the remote tier alone, as ``compare`` models it. Each waste has a range:
the model at the optimistic and the pessimistic ends of the runs (rates, stalls, drains), the
pessimistic end also with every local stall slowed as much as the slowest round of the drain
interference measurement. The recommendation follows the tie rule of every ranking
(:func:`ckptbench.bench.stats.leaders`): two levels only when their waste beats the single level's
beyond the runs' noise; when the two are tied, the single level (one tier to run) is recommended.
"""

from __future__ import annotations

from typing import Any

from ckptbench.bench.stats import leaders
from ckptbench.errors import UsageError
from ckptbench.model import interval as single
from ckptbench.model import twolevel
from ckptbench.model.interference import ASSUMED


def _local_cost(job: Any, model: Any, interference: float, stall_scale: float) -> single.CheckpointCost:
    if job.mode == "async" and model.stall_s is not None and model.persist_s is not None:
        return single.CheckpointCost(model.stall_s * stall_scale, model.persist_s, interference)
    return single.CheckpointCost.sync(model.checkpoint_s)


def _scenario(job: Any, local: Any, remote: Any, drain_gbps: float, q: float, stall_scale: float,
              remote_every: int | None) -> tuple[twolevel.TwoLevelCost, twolevel.TwoLevelAnalysis]:
    drain_f = local.interference if job.mode == "async" else ASSUMED.point
    cost = twolevel.TwoLevelCost(
        _local_cost(job, local, local.interference, stall_scale), job.rank_bytes / (drain_gbps * 1e9), drain_f,
        job.restart_s + local.restore_s, job.restart_s + remote.restore_s, q)
    return cost, twolevel.analyse(cost, job.failures.mtbf_s, job.every_s, remote_every)


def _worst_stall(drain: Any, widen: float) -> float:
    """How much slower a local stall gets during a drain at the pessimistic end: its slowest round."""
    return max([1.0, *[r for r in drain.stall_ratio_by_round if r == r]]) * widen


def scenarios(job: Any, local: Any, remote: Any, drain: Any, *, local_loss: float, remote_every: int | None = None,
              widen: float = 1.0, drain_cap_gbps: float | None = None,
              ) -> tuple[tuple[twolevel.TwoLevelCost, twolevel.TwoLevelAnalysis], ...]:
    """The two-level model at the point and at the optimistic and pessimistic ends of the runs:
    ``((cost, analysis) x 3)``. ``widen`` (>= 1) moves the drain's ends that far beyond its runs (and the
    pessimistic stall scale with them); ``drain_cap_gbps`` caps the drain's rate (a node's share of shared
    storage). Raises UsageError when a scenario cannot make progress."""
    drain_runs = drain.runs_drain_gbps
    worst_stall = _worst_stall(drain, widen)

    def capped(gbps: float) -> float:
        return gbps if drain_cap_gbps is None else min(gbps, drain_cap_gbps)

    ends = local.model_ends or (local.model, local.model)
    remote_ends = remote.model_ends or (remote.model, remote.model)
    return (
        _scenario(job, local.model, remote.model, capped(drain.drain_gbps), local_loss, 1.0, remote_every),
        _scenario(job, ends[0], remote_ends[0], capped(max(drain_runs) * widen), local_loss, 1.0, remote_every),
        _scenario(job, ends[1], remote_ends[1], capped(min(drain_runs) / widen), local_loss, worst_stall,
                  remote_every),
    )


def decide(job: Any, local: Any, remote: Any, drain: Any, *, local_loss: float, local_loss_source: str,
           remote_every: int | None = None, widen: float = 1.0, drain_cap_gbps: float | None = None,
           ) -> dict[str, Any]:
    """The ``two_level`` section of a ``compare --local --remote`` document (see the module; ``widen`` and
    ``drain_cap_gbps`` as :func:`scenarios`)."""
    if job.failures is None:
        raise UsageError("--local/--remote need a failure rate (--mtbf, --failures, ...): the choice between one "
                         "and two levels is a choice of waste")
    (cost, point), (_, best), (_, worst) = scenarios(job, local, remote, drain, local_loss=local_loss,
                                                     remote_every=remote_every, widen=widen,
                                                     drain_cap_gbps=drain_cap_gbps)
    worst_stall = _worst_stall(drain, widen)
    remote_ends = remote.model_ends or (remote.model, remote.model)
    analyses = (point, best, worst)

    def span(values: list[float | None]) -> list[float] | None:
        return None if None in values else [min(values), max(values)]  # type: ignore[type-var]

    two_waste = [a.waste_fraction for a in analyses]
    levels = [{"name": "local", "interval_s": point.interval_s, "every": 1},
              {"name": "remote", "interval_s": None if point.every is None else point.every * point.interval_s,
               "every": point.every}]
    single_model = remote.model
    single_cost = _local_cost(job, single_model, single_model.interference, 1.0)  # the remote tier's own save
    single_waste = [single_model.waste_fraction, *(m.waste_fraction for m in remote_ends)]
    out: dict[str, Any] = {
        "local": local.label,
        "remote": remote.label,
        "local_loss": local_loss,
        "local_loss_source": local_loss_source,
        "drain": drain.to_dict(),
        "drain_s": cost.drain_s,
        "drain_interference": cost.drain_interference,
        "local_restart_s": cost.local_restart_s,
        "remote_restart_s": cost.remote_restart_s,
        "stall_scale_pessimistic": worst_stall,
        "two_level": {
            "schedule": point.schedule,
            "levels": levels,
            "interval_s_range": span([a.interval_s for a in analyses]),
            "every_range": span([a.every for a in analyses]),
            "waste_fraction": point.waste_fraction,
            "waste_fraction_range": span(two_waste),
            "interval_plateau_s": list(point.interval_plateau_s),
            "recommended_interval_s": point.recommended_interval_s,
            "every_tied": list(point.every_tied) if point.every_tied else None,
            "at_interval": point.at_interval,
        },
        "single_level": {
            "tier": remote.label,
            "interval_s": single_model.optimal_interval_s,
            "interval_s_range": span([single_model.optimal_interval_s,
                                      *(m.optimal_interval_s for m in remote_ends)]),
            "waste_fraction": single_model.waste_fraction,
            "waste_fraction_range": span(single_waste) if single_model.waste_fraction is not None else None,
            "error": single_model.error,
        },
        "model": {  # the model at the point, as `ckptbench interval` holds it (for the plot)
            "cost": {"stall_s": cost.local.stall_s, "persist_s": cost.local.persist_s,
                     "interference": cost.local.interference, "drain_s": cost.drain_s,
                     "drain_interference": cost.drain_interference, "local_restart_s": cost.local_restart_s,
                     "remote_restart_s": cost.remote_restart_s, "local_loss": cost.local_loss},
            "mtbf_s": job.failures.mtbf_s,
            "two_level_schedule": {"levels": levels, "waste_fraction": point.waste_fraction,
                                   "interval_plateau_s": list(point.interval_plateau_s)},
            # the single level as measured on the remote tier (not the model's drain-as-persist stand-in)
            "single_cost": {"stall_s": single_cost.stall_s, "persist_s": single_cost.persist_s,
                            "interference": single_cost.interference, "restart_s": single_model.restart_s},
            "remote_only_schedule": {"levels": [{"name": "remote", "interval_s": single_model.optimal_interval_s,
                                                 "every": 1}],
                                     "waste_fraction": single_model.waste_fraction},
        },
    }
    if single_model.waste_fraction is None:
        choice, tied = "two-level", False
        reason = f"the remote tier alone cannot serve the job ({single_model.error})"
    elif point.schedule == "local-only":
        choice, tied = "two-level", False
        reason = ("no failure loses the local copy (--local-loss 0): checkpoint locally; the remote tier only "
                  "adds durability beyond the job")
    else:
        samples = [[w for w in single_waste if w is not None], two_waste]
        top = leaders(samples, higher_is_better=False)
        tied = len(top) > 1
        choice = "two-level" if top == [1] else "single-level"
        if choice == "two-level":
            reason = "two levels waste less than the remote tier alone, beyond the runs' spread"
        elif tied:
            reason = ("two levels and the remote tier alone are tied (their ranges overlap): one tier is simpler "
                      "to run")
        else:
            reason = "the remote tier alone wastes less: the local tier does not pay for its drains"
    out |= {"recommendation": choice, "tied": tied, "reason": reason}
    out["model"]["schedule"] = "two-level" if choice == "two-level" and point.every is not None else (
        "local-only" if choice == "two-level" else "remote-only")
    return out

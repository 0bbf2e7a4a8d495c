"""Pre-flight verdicts for two levels (pure): the job of ``preflight`` on a local tier drained to a remote
one (``preflight --local DIR --remote URL``).

The job is sized and its busiest node's bytes found as for one tier (:class:`~ckptbench.decide.verdict.Job`);
the measurement is ``compare``'s two-level one (:mod:`ckptbench.bench.two_levels`): both tiers and the
drain, by one process, read at the node's bytes (``node_bytes / rate``; the remote tier's and the
drain's rates capped by ``--aggregate-bandwidth`` shared by the job's nodes and by ``--node-network``).
Every figure is the model at the point and at the two ends of the runs, widened (in quadrature:
:func:`~ckptbench.decide.scaling.widen_end`) by ``knobs.SAMPLE_EXTRAPOLATION``: one process measured a
sample, not the job's ranks (:func:`~ckptbench.decide.scaling.sample_allowance`). The schedule
checked is the one the job would run: ``--interval`` (else the recommended local interval) and
``--remote-every`` (else the optimum's). A check is PASS or FAIL only when all three agree, else
BORDERLINE (the rule of :func:`~ckptbench.decide.verdict.evaluate`):

- ``checkpoint-time``: the local tier's stall per checkpoint against ``--max-ckpt-time``;
- ``overhead``: ``(stall + f P + f2 D / k) / tau`` against ``--max-overhead``;
- ``drain-keeps-up``: a drain (``D``) ends before the next one starts, ``k`` local checkpoints later;
- ``restore-local`` / ``restore-remote``: the time restarts from each tier take (``R1``, ``R2`` at the
  share of failures that use that tier) against ``--max-overhead`` (WARN up to twice it);
- ``free-space``: the local tier holds ``--retain`` steps, one being written and one waiting for its
  drain; a remote directory holds ``--retain`` steps of every node and one being drained;
- ``host-memory``: the node's staging, as for one tier.

The recommendation (single level or two levels, with ``tau`` and ``k``) is
:func:`~ckptbench.decide.twolevel_choice.decide`'s, by the tie rule.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ckptbench.bench.tier_comparison import JobSpec, Measured, TierResult, model_tier
from ckptbench.decide.advice import Advice
from ckptbench.decide.scaling import sample_allowance, widen_end
from ckptbench.decide.twolevel_choice import decide, scenarios
from ckptbench.decide.verdict import (
    FAIL,
    PASS,
    WARN,
    Check,
    Judged,
    _combine,
    host_memory_check,
)
from ckptbench.errors import UsageError
from ckptbench.model import twolevel
from ckptbench.model.interference import ASSUMED
from ckptbench.model.tiers import TierPrices
from ckptbench.units import format_duration, format_rate, format_size


@dataclass(frozen=True)
class NodeJobSpec(JobSpec):
    """``compare``'s job, scaled to the busiest node of preflight's: ``rank_bytes`` is the node's bytes (its
    ranks write one local disk and share one link to the remote tier)."""

    node_bytes: int = 0

    @property
    def rank_bytes(self) -> int:
        return self.node_bytes


@dataclass(frozen=True)
class TierFacts:
    """What the checks read besides the timings: free bytes on each tier (None: object storage) and the
    host's memory."""

    local_free_bytes: int | None
    remote_free_bytes: int | None
    host_memory_bytes: int | None
    remote_shared: bool = True


@dataclass(frozen=True)
class TwoLevelVerdict(Judged):
    checks: tuple[Check, ...]
    recommendation: tuple[Advice, ...]
    predictions: dict[str, Any]
    decision: dict[str, Any]  # decide()'s two_level section
    assumptions: tuple[str, ...]


def node_job(job: Any) -> NodeJobSpec:
    """The two-level job of preflight's ``job`` (:class:`~ckptbench.decide.verdict.Job`): async saves at its
    interference (else the assumed one) and its restart. Its ``--interval`` is evaluated by the checks (an
    interval too short for the drain fails ``drain-keeps-up``), not by the optimisation."""
    interference = job.interference if job.interference is not None else ASSUMED.point
    return NodeJobSpec(size=job.size, model=job.model_name, failures=job.failures, restart_s=job.restart_s,
                       mode="async", interference=interference, keep=job.retain,
                       node_bytes=job.node_bytes)


def remote_cap_gbps(job: Any) -> float | None:
    """The most one node moves to or from the remote tier: its share of ``--aggregate-bandwidth`` and
    ``--node-network`` (None: neither given)."""
    caps = []
    if job.aggregate_bps is not None:
        caps.append(job.aggregate_bps * job.node_bytes / job.size.total_bytes / 1e9)
    if job.node_network_bps is not None:
        caps.append(job.node_network_bps / 1e9)
    return min(caps) if caps else None


def _capped(measured: Measured, cap_gbps: float | None) -> Measured:
    if cap_gbps is None:
        return measured

    def cap(values: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(min(v, cap_gbps) for v in values)

    slower = measured.save_gbps / min(measured.save_gbps, cap_gbps)
    return replace(measured, save_gbps=min(measured.save_gbps, cap_gbps), load_gbps=min(measured.load_gbps, cap_gbps),
                   runs_save_gbps=cap(measured.runs_save_gbps), runs_load_gbps=cap(measured.runs_load_gbps),
                   persist_s=None if measured.persist_s is None else measured.persist_s * slower,
                   runs_persist_s=tuple(p * slower for p in measured.runs_persist_s))


def _ends(measured: Measured, widen: float) -> tuple[Measured, Measured]:
    best, worst = measured.ends()

    def scaled(m: Measured, faster: bool) -> Measured:
        def out(name: str, up: bool) -> float | None:
            value, point = getattr(m, name), getattr(measured, name)
            return None if value is None or point is None else widen_end(point, value, widen, up=up)

        # the best end: higher rates, shorter times; the worst the other way round
        return replace(m, save_gbps=out("save_gbps", faster), load_gbps=out("load_gbps", faster),
                       stall_s=out("stall_s", not faster), persist_s=out("persist_s", not faster))

    return scaled(best, True), scaled(worst, False)


def node_tier(job: NodeJobSpec, tier: TierResult, *, widen: float, cap_gbps: float | None = None) -> TierResult:
    """``tier`` (as ``compare`` measured it) modelled for the node: its bytes, the cap, the widened ends."""
    measured = _capped(tier.measured, cap_gbps)
    environment = getattr(tier.report, "environment", None) or {}
    part = (environment.get("target") or {}).get("part_size_bytes") if tier.target.on_objects else None
    ends = tuple(model_tier(job, end, TierPrices(), part_bytes=part) for end in _ends(measured, widen))
    return replace(tier, measured=measured, model=model_tier(job, measured, TierPrices(), part_bytes=part),
                   model_ends=ends)


def evaluate_two_levels(job: Any, local: TierResult, remote: TierResult, drain: Any, facts: TierFacts, *,
                        local_loss: float, local_loss_source: str, remote_every: int | None,
                        sampled_bytes: int) -> TwoLevelVerdict:
    """Checks, predictions with ranges and the recommendation for preflight's ``job`` on two levels (see
    the module). ``local``/``remote``: the tiers as ``compare`` measured them; ``drain``: the DrainBench."""
    spec = node_job(job)
    widen = sample_allowance(True)
    cap = remote_cap_gbps(job)
    local_t = node_tier(spec, local, widen=widen)
    remote_t = node_tier(spec, remote, widen=widen, cap_gbps=cap)
    decision = decide(spec, local_t, remote_t, drain, local_loss=local_loss, local_loss_source=local_loss_source,
                      remote_every=remote_every, widen=widen, drain_cap_gbps=cap)
    runs = scenarios(spec, local_t, remote_t, drain, local_loss=local_loss, remote_every=remote_every, widen=widen,
                     drain_cap_gbps=cap)
    point = runs[0][1]
    interval_s = job.interval_s if job.interval_s is not None else point.recommended_interval_s
    every = remote_every if remote_every is not None else point.every
    mtbf_s = job.failures.mtbf_s
    predicted = [_predict(cost, mtbf_s, interval_s, every) for cost, _ in runs]
    p = dict(predicted[0])
    for key in _RANGED:
        values = [e[key] for e in predicted]
        p[f"{key}_range"] = None if None in values else [min(values), max(values)]
    p |= {"interval_s": interval_s, "interval_is_optimal": job.interval_s is None, "remote_every": every,
          "remote_every_is_optimal": remote_every is None, "checkpoint_per_node_bytes": job.node_bytes,
          "checkpoint_total_bytes": job.size.total_bytes, "mtbf_s": mtbf_s, "local_loss": local_loss,
          "extrapolation_factor": widen, "remote_cap_bps": None if cap is None else cap * 1e9}
    per_end = [_checks(job, facts, e, local_loss) for e in predicted]
    checks = _combine(per_end[0], per_end[1], per_end[2], settle=_settle(job, sampled_bytes))
    return TwoLevelVerdict(tuple(checks), tuple(_advice(job, decision, p)), p, decision,
                           _assumptions(job, widen, cap, local_loss_source))


#: Predictions that carry a ``<name>_range``.
_RANGED = ("local_stall_s", "local_persist_s", "drain_s", "local_restore_s", "remote_restore_s",
           "overhead_fraction", "waste_fraction", "drain_window_s")


def _predict(cost: twolevel.TwoLevelCost, mtbf_s: float, interval_s: float, every: int | None) -> dict[str, Any]:
    local = cost.local
    k = every or 1
    window = k * (interval_s + cost.c1_s) + cost.c2_s  # wall time from one drain's start to the next one's
    try:
        waste = (twolevel.waste_fraction(interval_s, every, cost, mtbf_s) if every is not None else None)
    except UsageError:
        waste = None
    return {
        "local_stall_s": local.stall_s, "local_persist_s": local.persist_s, "local_blocking_s": local.blocking_s,
        "drain_s": cost.drain_s, "drain_interference": cost.drain_interference,
        "drain_window_s": window, "local_restore_s": cost.local_restart_s, "remote_restore_s": cost.remote_restart_s,
        "overhead_fraction": (cost.c1_s + (cost.c2_s / k if every is not None else 0.0)) / interval_s,
        "waste_fraction": waste, "every": every,
    }


def _restore_check(name: str, job: Any, restart_s: float, share: float, mtbf_s: float, tier: str) -> Check:
    fraction = share * restart_s / mtbf_s
    status = PASS if fraction <= job.max_overhead else WARN if fraction <= 2 * job.max_overhead else FAIL
    return Check(
        name, status, fraction, job.max_overhead, "_fraction",
        f"a restart from the {tier} tier takes {format_duration(restart_s)}, for {share:.0%} of failures every "
        f"{format_duration(mtbf_s)} on average: {fraction:.2%} of the time",
        None if status == PASS else f"faster reads from the {tier} tier (more threads, a faster tier) or fewer "
                                    "failures (hot spares)")


def _checks(job: Any, facts: TierFacts, e: dict[str, Any], q: float) -> list[Check]:
    blocking = e["local_blocking_s"]
    out = [
        _at_most("checkpoint-time", e["local_stall_s"], job.max_ckpt_time_s, "_s",
                 f"training blocks {format_duration(e['local_stall_s'])} per local checkpoint (async stall; persist "
                 f"{format_duration(e['local_persist_s'])})",
                 "a faster local tier, or sharding more of the state so every rank stages less"),
        _at_most("overhead", e["overhead_fraction"], job.max_overhead, "_fraction",
                 f"local checkpoints and drains cost {e['overhead_fraction']:.2%} of compute",
                 f"checkpoint less often (a local checkpoint costs {format_duration(blocking)}), or drain less often "
                 "(--remote-every)"),
    ]
    if e["every"] is None:
        out.append(Check("drain-keeps-up", PASS, e["drain_s"], None, "_s",
                         f"no failure restarts from the remote tier (--local-loss 0): drains are not paced "
                         f"(one takes {format_duration(e['drain_s'])})"))
    else:
        out.append(_at_most("drain-keeps-up", e["drain_s"], e["drain_window_s"], "_s",
                            f"a drain of the node's {format_size(job.node_bytes)} takes "
                            f"{format_duration(e['drain_s'])}; one starts every {e['every']} local checkpoint(s), "
                            f"{format_duration(e['drain_window_s'])} apart",
                            "drain less often (a larger --remote-every), checkpoint less often, or a faster link to "
                            "the remote tier"))
    out.append(_restore_check("restore-local", job, e["local_restore_s"], 1 - q, job.failures.mtbf_s, "local"))
    out.append(_restore_check("restore-remote", job, e["remote_restore_s"], q, job.failures.mtbf_s, "remote"))
    node = job.node_bytes
    if facts.local_free_bytes is not None:  # retained + one being written + one waiting for its drain
        out.append(_space_check("free-space", "local", facts.local_free_bytes, node * (job.retain + 2),
                                f"{job.retain} retained checkpoints + 1 being written + 1 waiting for its drain",
                                "free space, retain fewer checkpoints (--retain), or a bigger local tier"))
    if facts.remote_free_bytes is not None:
        on_remote = job.size.total_bytes if facts.remote_shared else node
        out.append(_space_check("remote-free-space", "remote", facts.remote_free_bytes, on_remote * (job.retain + 1),
                                f"{job.retain} retained checkpoints + 1 being drained",
                                "free space on the remote tier, or retain fewer checkpoints there"))
    memory = host_memory_check(job, node, facts.host_memory_bytes)
    return out if memory is None else [*out, memory]


def _at_most(name: str, value: float, limit: float, unit: str, message: str, remedy: str) -> Check:
    """PASS when ``value`` is within ``limit``, else FAIL with ``remedy``."""
    status = PASS if value <= limit else FAIL
    return Check(name, status, value, limit, unit, message, None if status == PASS else remedy)


def _space_check(name: str, tier: str, free_bytes: int, needed_bytes: int, what: str, remedy: str) -> Check:
    status = PASS if free_bytes >= needed_bytes else FAIL
    return Check(name, status, free_bytes, needed_bytes, "_bytes",
                 f"{tier} tier: {format_size(free_bytes)} free; {what} need {format_size(needed_bytes)}",
                 None if status == PASS else remedy)


def _settle(job: Any, sampled_bytes: int) -> str:
    ways = ["more --repeat on a quiet machine"]
    if job.node_bytes > sampled_bytes:
        ways.insert(0, "a larger --measure-size, nearer the node's bytes")
    if job.interference is None:
        ways.append("--interference measured on the training nodes")
    return ", ".join(ways[:-1]) + f", or {ways[-1]}" if len(ways) > 1 else ways[0]


def _advice(job: Any, decision: dict[str, Any], p: dict[str, Any]) -> list[Advice]:
    two, one = decision["two_level"], decision["single_level"]
    if decision["recommendation"] == "single-level":
        return [Advice("schedule", "single-level", decision["reason"]),
                Advice("interval_s", one["interval_s"],
                       f"checkpoints straight to the remote tier at its optimum (waste {one['waste_fraction']:.2%})")]
    local_level, remote_level = two["levels"]
    out = [Advice("schedule", "two-level", decision["reason"]),
           Advice("interval_s", two["recommended_interval_s"],
                  f"local checkpoints: a round value within {format_duration(two['interval_plateau_s'][0])}–"
                  f"{format_duration(two['interval_plateau_s'][1])}, within 0.1 % of the least waste "
                  f"{two['waste_fraction']:.2%}")]
    if remote_level["every"] is not None:
        out.append(Advice("remote_every", remote_level["every"],
                          f"a drain every {remote_level['every']} local checkpoint(s) "
                          f"(one takes {format_duration(p['drain_s'])})"))
    return out


def _assumptions(job: Any, widen: float, cap: float | None, local_loss_source: str) -> tuple[str, ...]:
    out = [f"the busiest node's {format_size(job.node_bytes)} go to its local tier at the rate measured here and "
           "are drained from it at the measured drain rate; a restart reloads them from either tier at its "
           "measured cold-read rate",
           "one process measured both tiers and the drain; saves are async (stall, then persist beside training)",
           f"share of failures that lose the node's local copy: {local_loss_source}",
           "failures are exponential at the job's MTBF"]
    if widen > 1:
        out.append(f"ranges widen the runs' spread by up to x{widen:.2g} either way (in quadrature): a sample "
                   "measured without the job's launcher, before it starts, is not the job's ranks "
                   "(CKPTBENCH_SAMPLE_EXTRAPOLATION)")
    if cap is not None:
        out.append(f"the remote tier and the drain move at most {format_rate(cap * 1e9)} per node "
                   "(--aggregate-bandwidth shared by the job's nodes, --node-network)")
    elif job.nodes > 1:
        out.append(f"the remote tier is assumed to give each of the job's {job.nodes} nodes the measured rate; give "
                   "--aggregate-bandwidth to cap it")
    return tuple(out)

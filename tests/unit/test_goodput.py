"""Goodput and cost: the arithmetic of the definitions, hot spares, what-ifs, and the simulator."""

from __future__ import annotations

import math

import pytest

from ckptbench.errors import UsageError
from ckptbench.model.failures import MAX_COUNT, FailureModel
from ckptbench.model.goodput import (
    BADPUT_CATEGORIES,
    CheckpointPolicy,
    Pricing,
    Recovery,
    TrainingRun,
    effective_replace_s,
    erlang_b,
    estimate,
    exact_wall_hours,
    first_order_ratio,
    what_if,
)
from ckptbench.model.interval import CheckpointCost, expected_wall_time_s
from ckptbench.model.simulate import SimulationConfig, simulate

HOUR = 3600.0
RUN = TrainingRun(params=100e9, tokens=20e12, gpus=4000, peak_flops=1979e12, mfu=0.35, gpus_per_node=8)
ONE_PER_DAY = FailureModel.from_faults_per_day(1)
RECOVERY = Recovery(detect_s=HOUR, replace_s=HOUR, resume_s=0.5 * HOUR)  # 2.5 h per fault


def test_planned_time_is_6ND_over_cluster_flops() -> None:
    assert RUN.compute_flops == pytest.approx(1.2e25)
    planned_s = 1.2e25 / (4000 * 1979e12 * 0.35)
    assert RUN.planned_s == pytest.approx(planned_s)
    assert RUN.planned_s / HOUR == pytest.approx(1203.1, abs=0.05)
    assert RUN.nodes == 500


def test_simple_model_is_faults_times_recovery() -> None:
    result = estimate(RUN, ONE_PER_DAY, RECOVERY)
    planned_h = RUN.planned_s / HOUR
    # one fault per day over the planned days, 2.5 h each
    assert result.faults == pytest.approx(planned_h / 24)
    assert result.wasted_hours == pytest.approx(result.faults * 2.5)
    assert result.wasted_fraction_of_plan == pytest.approx(2.5 / 24)
    assert result.goodput == pytest.approx(24 / 26.5)
    assert result.wall_hours == pytest.approx(planned_h * 26.5 / 24)
    assert result.badput_hours == pytest.approx({
        "checkpoint_stall": 0.0, "lost_progress": 0.0, "detection": result.faults,
        "replacement": result.faults, "restart_restore": 0.5 * result.faults,
    })
    assert not result.includes_checkpointing


def test_badput_adds_up_to_the_waste() -> None:
    checkpoint = CheckpointPolicy(1800, CheckpointCost.sync(140))
    result = estimate(RUN, ONE_PER_DAY, RECOVERY, checkpoint=checkpoint)
    assert tuple(result.badput_hours) == BADPUT_CATEGORIES
    assert sum(result.badput_hours.values()) == pytest.approx(result.wasted_hours)
    assert result.wall_hours == pytest.approx(result.planned_hours + result.wasted_hours)
    assert result.goodput == pytest.approx(result.planned_hours / result.wall_hours)


def test_checkpointing_adds_stalls_and_lost_work() -> None:
    tau, ckpt = 1800.0, 140.0
    result = estimate(RUN, ONE_PER_DAY, RECOVERY, checkpoint=CheckpointPolicy(tau, CheckpointCost.sync(ckpt)))
    planned_s = RUN.planned_s
    stalls_s = planned_s / tau * ckpt
    lost_s = (tau + ckpt) / 2
    faults = (planned_s + stalls_s) / 86400 / (1 - lost_s / 86400)
    assert result.badput_hours["checkpoint_stall"] == pytest.approx(stalls_s / HOUR)
    assert result.faults == pytest.approx(faults)
    assert result.badput_hours["lost_progress"] == pytest.approx(faults * lost_s / HOUR)
    assert result.includes_checkpointing
    assert result.checkpoints == pytest.approx(planned_s / tau)
    assert result.wasted_hours > estimate(RUN, ONE_PER_DAY, RECOVERY).wasted_hours


def test_cost_per_node_hour_equals_cost_per_gpu_hour_at_the_same_rate() -> None:
    per_node = estimate(RUN, ONE_PER_DAY, RECOVERY, pricing=Pricing(node_hour_usd=90))
    per_gpu = estimate(RUN, ONE_PER_DAY, RECOVERY, pricing=Pricing(gpu_hour_usd=11.25))
    assert per_node.planned_cost_usd == pytest.approx(45_000 * per_node.planned_hours)
    assert per_node.wasted_cost_usd == pytest.approx(45_000 * per_node.wasted_hours)
    assert per_gpu.wasted_cost_usd == pytest.approx(per_node.wasted_cost_usd)
    assert per_gpu.total_cost_usd == pytest.approx(per_node.planned_cost_usd + per_node.wasted_cost_usd)


def test_no_pricing_means_no_dollars() -> None:
    result = estimate(RUN, ONE_PER_DAY, RECOVERY)
    assert result.planned_cost_usd is None and result.wasted_cost_usd is None


def test_erlang_b() -> None:
    a = 0.3
    assert erlang_b(0, a) == 1.0
    assert erlang_b(1, a) == pytest.approx(a / (1 + a))
    assert erlang_b(2, a) == pytest.approx((a**2 / 2) / (1 + a + a**2 / 2))
    assert erlang_b(3, 0.0) == 0.0


def _erlang_b_recurrence(servers: int, load: float) -> float:
    """The textbook recurrence, K steps: the reference for :func:`erlang_b`."""
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = load * blocking / (k + load * blocking)
    return blocking


@pytest.mark.parametrize("servers", [1, 2, 5, 17, 100, 999])
@pytest.mark.parametrize("load", [1e-300, 1e-6, 0.04, 0.5, 1.0, 3.0, 16.5, 99.9, 100.0, 1000.0, 1e6, 1e300])
def test_erlang_b_is_the_recurrence(servers: int, load: float) -> None:
    expected = _erlang_b_recurrence(servers, load)
    assert erlang_b(servers, load) == pytest.approx(expected, rel=1e-10, abs=1e-300)


def test_erlang_b_for_huge_spare_counts_walks_only_the_terms_that_matter() -> None:
    # The recurrence loops K times whatever the load; with K = 10^8 spares and a load of 10^8 or
    # 3.6e12 (a 1 ns MTBF, an hour to replace) that was a hang. Now a few thousand steps at most.
    assert erlang_b(10**6, 1e6) == pytest.approx(_erlang_b_recurrence(10**6, 1e6), rel=1e-9)
    assert erlang_b(10**6, 1.003e6) == pytest.approx(_erlang_b_recurrence(10**6, 1.003e6), rel=1e-9)
    # B(K, K) ~ 1 / (sqrt(pi K / 2) + 2/3) (Jagerman); B(K, a) ~ 1 - K/a for a far above K.
    assert erlang_b(MAX_COUNT, MAX_COUNT) == pytest.approx(1 / (math.sqrt(math.pi * MAX_COUNT / 2) + 2 / 3), rel=1e-6)
    assert erlang_b(MAX_COUNT, 3.6e12) == pytest.approx(1 - MAX_COUNT / 3.6e12, rel=1e-9)
    assert erlang_b(MAX_COUNT, HOUR / 86400) == 0.0
    assert erlang_b(MAX_COUNT, MAX_COUNT / 2) == 0.0  # e^-(K ln 2 - K/2), far below the smallest float
    with pytest.raises(UsageError, match="hot spare count about 10\\^18 is more than 100,000,000"):
        erlang_b(10**18, 50.0)


def test_more_hot_spares_than_nodes_are_refused_naming_both() -> None:
    with pytest.raises(UsageError, match="hot spare count 501 is more than the job's 500 nodes"):
        estimate(RUN, ONE_PER_DAY, RECOVERY, hot_spare_nodes=501)
    at_most = {s.name for s in what_if(RUN, ONE_PER_DAY, RECOVERY, hot_spare_nodes=500)[0]}
    assert at_most == {"faster_detection", "no_hot_spares"}  # no 501st spare


def test_hot_spares_shrink_replacement_and_cost_idle_nodes() -> None:
    pricing = Pricing(node_hour_usd=90)
    base = estimate(RUN, ONE_PER_DAY, RECOVERY, pricing=pricing)
    spare = estimate(RUN, ONE_PER_DAY, RECOVERY, pricing=pricing, hot_spare_nodes=1)
    load = HOUR / 86400  # replace time / MTBF
    assert spare.replace_effective_s == pytest.approx(HOUR * load / (1 + load))
    assert spare.badput_hours["replacement"] < base.badput_hours["replacement"] / 20
    assert spare.spare_cost_usd == pytest.approx(90 * spare.wall_hours)
    assert spare.wasted_cost_usd == pytest.approx(spare.wall_cost_usd + spare.spare_cost_usd - spare.planned_cost_usd)


def test_what_if_scenarios() -> None:
    pricing = Pricing(node_hour_usd=90)
    base = estimate(RUN, ONE_PER_DAY, RECOVERY, pricing=pricing)
    computed, skipped = what_if(RUN, ONE_PER_DAY, RECOVERY, pricing=pricing)
    scenarios = {s.name: s for s in computed}
    assert set(scenarios) == {"faster_detection", "hot_spare"} and skipped == []
    faster = scenarios["faster_detection"]
    # Without checkpointing faults = lambda * planned, so halving detection saves faults x detect / 2 exactly.
    assert faster.saved_hours == pytest.approx(base.faults * 0.5)
    assert faster.extra_cost_usd == 0
    assert faster.net_saving_usd == pytest.approx(45_000 * faster.saved_hours)
    spare = scenarios["hot_spare"]
    assert spare.extra_cost_usd == pytest.approx(spare.result.spare_cost_usd)
    assert spare.net_saving_usd == pytest.approx(45_000 * spare.saved_hours - spare.extra_cost_usd)


def test_what_if_with_spares_and_checkpoints() -> None:
    checkpoint = CheckpointPolicy(1800, CheckpointCost.sync(140))
    scenarios = {s.name: s for s in what_if(RUN, ONE_PER_DAY, RECOVERY, checkpoint=checkpoint, hot_spare_nodes=2)[0]}
    assert set(scenarios) == {"faster_detection", "hot_spare", "no_hot_spares", "optimal_interval"}
    assert scenarios["no_hot_spares"].saved_hours < 0
    assert scenarios["optimal_interval"].saved_hours > 0  # 30 min is far below the optimum for 1 fault/day
    assert scenarios["hot_spare"].net_saving_usd is None  # no pricing


@pytest.mark.parametrize(
    ("cost", "restart"),
    [(CheckpointCost.sync(140), 2.5 * HOUR), (CheckpointCost(stall_s=2, persist_s=300, interference=0.1), HOUR)],
)
def test_goodput_model_agrees_with_the_simulator(cost: CheckpointCost, restart: float) -> None:
    # The goodput accounting lets failures strike only while the job runs (the simulator's
    # restart_can_fail=False) and uses the first-order lost work per fault; it must agree with the
    # simulated wall time to second order in (tau + C)/M: within 1 % here, where that is 0.02.
    run = TrainingRun(params=1.0, tokens=500 * HOUR / 6, gpus=1, peak_flops=1.0, mfu=1.0)  # 500 h planned
    failures = FailureModel(86400.0)
    tau = 1800.0
    result = estimate(run, failures, Recovery(restart, 0, 0), checkpoint=CheckpointPolicy(tau, cost))
    config = SimulationConfig(run.planned_s, tau, cost, failures.mtbf_s, restart, runs=20_000,
                              restart_can_fail=False)
    simulated = simulate(config)
    assert result.wall_hours * HOUR == pytest.approx(simulated.mean_wall_s, rel=0.01)
    assert result.faults == pytest.approx(simulated.failures.mean(), rel=0.01)
    exact = expected_wall_time_s(run.planned_s, tau, cost, failures.mtbf_s, restart, restart_can_fail=False)
    assert result.wall_hours * HOUR == pytest.approx(exact, rel=0.01)


@pytest.mark.parametrize(
    "make",
    [
        lambda: TrainingRun(1e9, 1e12, 8, 1e15, 1.5),
        lambda: TrainingRun(1e9, 1e12, 8, 1e15, 0.0),
        lambda: TrainingRun(1e9, 1e12, 0, 1e15, 0.4),
        lambda: TrainingRun(-1, 1e12, 8, 1e15, 0.4),
        lambda: Pricing(gpu_hour_usd=2, node_hour_usd=16),
        lambda: Pricing(gpu_hour_usd=0),
        lambda: Recovery(-1, 0, 0),
        lambda: CheckpointPolicy(0, CheckpointCost.sync(10)),
        lambda: CheckpointPolicy(100, CheckpointCost(1, 1000)),  # two checkpoints in flight
        lambda: erlang_b(-1, 0.1),
    ],
)
def test_bad_values_are_usage_errors(make) -> None:
    with pytest.raises(UsageError):
        make()


def test_overflowing_compute_or_cost_is_refused_naming_the_inputs() -> None:
    with pytest.raises(UsageError, match=r"6 N D = 6 x 1e\+200 parameters x 1e\+200 tokens is not a finite number"):
        TrainingRun(1e200, 1e200, 8, 1e15, 0.4)
    with pytest.raises(UsageError, match="not a finite time of at least 1 ns"):
        TrainingRun(1e-300, 1e-300, 8, 1e15, 0.4)  # 6 N D underflows to 0
    with pytest.raises(UsageError, match="is not a positive finite rate"):
        TrainingRun(1e9, 1e12, 8, 1e-300, 1e-300)  # GPUs x peak x MFU underflows to 0
    with pytest.raises(UsageError, match="cost .* is not a finite number"):
        estimate(RUN, ONE_PER_DAY, RECOVERY, pricing=Pricing(node_hour_usd=1e305))
    with pytest.raises(UsageError, match="inf must be finite"):
        TrainingRun(math.inf, 1e12, 8, 1e15, 0.4)


def test_checkpoint_policy_uses_the_same_in_flight_check_as_the_interval_model() -> None:
    cost = CheckpointCost(stall_s=1, persist_s=1000, interference=0.25)
    CheckpointPolicy(cost.min_interval_s * (1 - 1e-13), cost)  # the bound, give or take rounding
    with pytest.raises(UsageError, match=r"two checkpoints in flight.*at least \(1 - f\) P = 12m 30s"):
        CheckpointPolicy(700, cost)


def test_both_prices_are_refused_naming_both() -> None:
    with pytest.raises(UsageError, match="GPU-hour cost 2 and node-hour cost 16 both give the price"):
        Pricing(gpu_hour_usd=2, node_hour_usd=16)


def test_first_order_accounting_is_close_to_the_exact_model_only_for_small_ratios() -> None:
    # the case of docs/commands/goodput.md: checkpoint every 30 min, 2.5 h recovery, one fault a day: ratio 0.13, within 1 %.
    short = CheckpointPolicy(1800, CheckpointCost.sync(140))
    assert first_order_ratio(RUN, ONE_PER_DAY, RECOVERY, short) == pytest.approx((1800 + 140 + 9000) / 86400)
    result = estimate(RUN, ONE_PER_DAY, RECOVERY, checkpoint=short)
    assert exact_wall_hours(RUN, ONE_PER_DAY, RECOVERY, short) == pytest.approx(result.wall_hours, rel=0.01)
    # Every 23 h: ratio 1.06, and the first-order accounting overstates the wall time by over 10 %.
    long = CheckpointPolicy(23 * HOUR, CheckpointCost.sync(140))
    assert first_order_ratio(RUN, ONE_PER_DAY, RECOVERY, long) > 1
    result = estimate(RUN, ONE_PER_DAY, RECOVERY, checkpoint=long)
    assert result.wall_hours > 1.1 * exact_wall_hours(RUN, ONE_PER_DAY, RECOVERY, long)
    # Hot spares shorten the recovery in both.
    assert first_order_ratio(RUN, ONE_PER_DAY, RECOVERY, long, 1) < first_order_ratio(RUN, ONE_PER_DAY, RECOVERY, long)


def test_a_checkpoint_longer_than_the_mtbf_cannot_keep_up_as_in_the_interval_model() -> None:
    # A 3.2 h checkpoint with a 3 h MTBF used to get a full report; a 4 h one was refused with the
    # optimal-interval what-if's lost work. Both now get the interval model's refusal, about yours.
    three_hours = FailureModel(3 * HOUR)
    for checkpoint_s, shown in ((3.2 * HOUR, "3h 12m"), (4 * HOUR, "4h")):
        checkpoint = CheckpointPolicy(60, CheckpointCost.sync(checkpoint_s))
        with pytest.raises(UsageError, match=f"cannot keep up: a checkpoint takes {shown} but the job fails every 3h"):
            estimate(RUN, three_hours, RECOVERY, checkpoint=checkpoint)
        with pytest.raises(UsageError, match="cannot keep up"):
            what_if(RUN, three_hours, RECOVERY, checkpoint=checkpoint)


def test_a_what_if_that_cannot_be_computed_is_skipped_with_its_reason() -> None:
    # s = 1.5 h, P = 1.35 h, every 1.35 h (the bound), MTBF 3 h: a fault loses 2.8 h, the run finishes.
    # At the exact optimum (2.1 h) it would lose 3.15 h, more than the MTBF: that what-if is left out.
    cost = CheckpointCost(stall_s=1.5 * HOUR, persist_s=1.35 * HOUR)
    checkpoint = CheckpointPolicy(1.35 * HOUR, cost)
    three_hours, quick = FailureModel(3 * HOUR), Recovery(60, 60, 60)
    base = estimate(RUN, three_hours, quick, checkpoint=checkpoint)
    computed, skipped = what_if(RUN, three_hours, quick, checkpoint=checkpoint)
    assert {s.name for s in computed} == {"faster_detection", "hot_spare"}
    [optimum] = skipped
    assert optimum.name == "optimal_interval" and "(the optimum)" in optimum.description
    assert "never finishes" in optimum.reason and "3.15 h of work" in optimum.reason
    assert computed[0].saved_hours == pytest.approx(base.wall_hours - computed[0].result.wall_hours)


def test_zero_recovery_times_are_allowed_and_instant_detection_is_not_halved() -> None:
    instant = Recovery(detect_s=0, replace_s=0, resume_s=0)
    result = estimate(RUN, ONE_PER_DAY, instant)
    assert result.wall_hours == result.planned_hours and result.wasted_hours == 0
    computed, skipped = what_if(RUN, ONE_PER_DAY, instant)
    assert {s.name for s in computed} == {"hot_spare"} and skipped == []


def test_counts_too_large_for_a_float_are_refused_and_nodes_are_whole() -> None:
    # 10^400 GPUs used to raise OverflowError from GPUs x peak FLOP/s.
    with pytest.raises(UsageError, match="GPU count about 10\\^400 is more than 100,000,000"):
        TrainingRun(1e9, 1e12, 10**400, 1e15, 0.4)
    with pytest.raises(UsageError, match="GPUs per node about 10\\^400 is more than 100,000,000"):
        TrainingRun(1e9, 1e12, 8, 1e15, 0.4, gpus_per_node=10**400)
    assert TrainingRun(1e9, 1e12, MAX_COUNT - 1, 1e15, 0.4).nodes == MAX_COUNT // 8
    assert TrainingRun(1e9, 1e12, 9, 1e15, 0.4).nodes == 2


def test_losing_more_work_per_fault_than_the_mtbf_never_finishes() -> None:
    checkpoint = CheckpointPolicy(2 * 86400, CheckpointCost.sync(60))
    with pytest.raises(UsageError, match="never finishes"):
        estimate(RUN, ONE_PER_DAY, RECOVERY, checkpoint=checkpoint)


def test_a_recovery_as_long_as_the_mtbf_cannot_keep_up() -> None:
    # A million faults a day (MTBF 86.4 ms) against 2.5 h of recovery gave 10,449,033 days and
    # "10416666.7 % of the plan": most recoveries would be struck again, which the model absorbs for free.
    with pytest.raises(UsageError, match=r"recovery cannot keep up: each fault takes 2h 30m .* every 86\.4 ms"):
        estimate(RUN, FailureModel.from_faults_per_day(1e6), RECOVERY)
    with pytest.raises(UsageError, match="recovery cannot keep up"):
        estimate(RUN, FailureModel(2.5 * HOUR), RECOVERY)  # as long as the MTBF
    below = estimate(RUN, FailureModel(2.6 * HOUR), RECOVERY)  # just below: computed as before
    assert below.faults * 2.5 == pytest.approx(below.wasted_hours)
    # Hot spares count: 250 spares cut the replace time to about nothing, and the recovery keeps up.
    mtbf = FailureModel(1.6 * HOUR)
    with pytest.raises(UsageError, match="recovery cannot keep up"):
        estimate(RUN, mtbf, RECOVERY)
    assert effective_replace_s(RUN, mtbf, RECOVERY, 250) < 1
    spared = estimate(RUN, mtbf, RECOVERY, hot_spare_nodes=250)
    computed, skipped = what_if(RUN, mtbf, RECOVERY, hot_spare_nodes=250)
    assert spared.wall_hours > spared.planned_hours
    assert [s.name for s in skipped] == ["no_hot_spares"] and "recovery cannot keep up" in skipped[0].reason


def test_an_interval_on_the_optimum_plateau_gets_no_optimal_interval_what_if() -> None:
    # A 140 s checkpoint at one fault a day: the optimum is about 1.5 h and its plateau (waste within 0.1
    # points) spans tens of minutes either side; moving from a point on it is no what-if worth naming.
    from ckptbench.model.interval import optimum_plateau

    cost = CheckpointCost.sync(140)
    recovery_s = RECOVERY.detect_s + RECOVERY.replace_s + RECOVERY.resume_s
    low, high = optimum_plateau(cost, ONE_PER_DAY.mtbf_s, recovery_s)
    assert low < 0.95 * high
    on = CheckpointPolicy(math.sqrt(low * high) * 1.01, cost)  # on the plateau, not at the optimum itself
    computed, skipped = what_if(RUN, ONE_PER_DAY, RECOVERY, checkpoint=on)
    assert "optimal_interval" not in {s.name for s in computed}
    [tied] = [s for s in skipped if s.name == "optimal_interval"]
    assert "within 0.1 percentage points of the optimum" in tied.reason
    below = CheckpointPolicy(low * 0.9, cost)  # just off the plateau: named, and it saves time
    computed, skipped = what_if(RUN, ONE_PER_DAY, RECOVERY, checkpoint=below)
    [move] = [s for s in computed if s.name == "optimal_interval"]
    assert move.saved_hours > 0 and not [s for s in skipped if s.name == "optimal_interval"]

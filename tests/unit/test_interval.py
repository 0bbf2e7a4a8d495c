"""Young, Daly, the exact optimum of Daly's model, and the async model."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ckptbench.errors import UsageError
from ckptbench.model import interval as model
from ckptbench.model.interval import (
    MAX_EXPONENT,
    CheckpointCost,
    analyse,
    check_can_keep_up,
    check_in_flight,
    cycle_time_s,
    daly_interval_s,
    exact_interval_s,
    expected_wall_time_s,
    first_order_waste,
    intervals_for,
    lost_work_per_failure_s,
    overhead_fraction,
    waste_curve,
    waste_fraction,
    young_interval_s,
)

MINUTE, HOUR = 60.0, 3600.0


def test_young_by_hand() -> None:
    # sqrt(2 * 300 s * 86400 s) = sqrt(51,840,000) = 7200 s
    assert young_interval_s(300, 86400) == pytest.approx(7200.0)


def test_daly_by_hand() -> None:
    # C/2M = 1/576, sqrt = 1/24: 7200 (1 + 1/72 + 1/5184) - 300
    assert daly_interval_s(300, 86400) == pytest.approx(7200 + 100 + 7200 / 5184 - 300)


@pytest.mark.parametrize(
    ("mtbf_s", "published_min", "rounding_min"),
    # Daly (2006), Figs. 3-5: delta = 5 min, R = 10 min, Ts = 500 h; "the new model predicts tau_opt = ..."
    # (published rounded to whole minutes, and to 0.1 min for the last).
    [(24 * HOUR, 117, 0.5), (6 * HOUR, 57, 0.5), (15 * MINUTE, 9.1, 0.05)],
)
def test_daly_reproduces_his_published_examples(mtbf_s: float, published_min: float, rounding_min: float) -> None:
    assert daly_interval_s(5 * MINUTE, mtbf_s) / MINUTE == pytest.approx(published_min, abs=rounding_min)


def test_daly_returns_mtbf_when_checkpoint_exceeds_twice_it() -> None:
    assert daly_interval_s(500, 200) == 200


@pytest.mark.parametrize(
    ("checkpoint_s", "mtbf_s"),
    [(300, 86400), (300, 21600), (300, 900), (1, 1e7), (140, 3 * HOUR), (0.5 * HOUR, HOUR)],
)
def test_exact_optimum_matches_lambert_w(checkpoint_s: float, mtbf_s: float) -> None:
    # d/dtau of (e^((tau+C)/M) - 1)/tau = 0  <=>  e^((tau+C)/M)(1 - tau/M) = 1
    #                                        <=>  tau = M (1 + W0(-e^(-(1 + C/M))))
    scipy_special = pytest.importorskip("scipy.special")
    closed = mtbf_s * (1.0 + scipy_special.lambertw(-math.exp(-(1.0 + checkpoint_s / mtbf_s))).real)
    assert exact_interval_s(checkpoint_s, mtbf_s) == pytest.approx(closed, rel=1e-6)


@pytest.mark.parametrize(("checkpoint_s", "mtbf_s"), [(1e-9, 1e12 * HOUR), (1e-6, 1e9), (1e-30, 1.0)])
def test_exact_optimum_for_tiny_checkpoint_to_mtbf_ratios_is_young(checkpoint_s: float, mtbf_s: float) -> None:
    # C/M far below 1e-24: the optimum sqrt(2CM) lies far below 1e-12 M, where the search used to stop.
    assert exact_interval_s(checkpoint_s, mtbf_s) == pytest.approx(young_interval_s(checkpoint_s, mtbf_s), rel=1e-6)


@pytest.mark.parametrize("ratio", [1e-4, 1e-3, 1e-2])
def test_daly_is_close_to_the_exact_optimum_and_young_is_first_order(ratio: float) -> None:
    mtbf = 86400.0
    checkpoint = ratio * mtbf
    exact = exact_interval_s(checkpoint, mtbf)
    # Daly's perturbation series is accurate to well under 0.1 % for C/M <= 1 %.
    assert daly_interval_s(checkpoint, mtbf) == pytest.approx(exact, rel=1e-3)
    # Young drops the O(sqrt(C/M)) correction: its error is about (2/3) sqrt(C/2M).
    young_error = young_interval_s(checkpoint, mtbf) / exact - 1.0
    assert 0 < young_error < math.sqrt(2 * ratio)


def test_exact_optimum_does_not_depend_on_restart() -> None:
    cost = CheckpointCost.sync(140)
    optima = {analyse(cost, 3 * HOUR, r).optimal_interval_s for r in (0.0, 60.0, 3600.0)}
    assert max(optima) == pytest.approx(min(optima), rel=1e-12)


@st.composite
def costs(draw: st.DrawFn) -> CheckpointCost:
    """Sync (persist 0) or async checkpoint costs."""
    stall = draw(st.floats(0.1, 600))
    if draw(st.booleans()):
        return CheckpointCost.sync(stall)
    return CheckpointCost(stall, draw(st.floats(1, 3600)), draw(st.floats(0, 0.5)))


@given(cost=costs(), mtbf_s=st.floats(HOUR, 100 * HOUR), restart_s=st.floats(0, 2 * HOUR))
def test_the_optimum_minimises_the_waste_and_waste_is_convex_around_it(
    cost: CheckpointCost, mtbf_s: float, restart_s: float,
) -> None:
    assume(cost.durable_s < mtbf_s / 4)
    result = analyse(cost, mtbf_s, restart_s)
    tau = result.optimal_interval_s
    best = waste_fraction(tau, cost, mtbf_s, restart_s)
    assert best == pytest.approx(result.waste_fraction)
    for factor in (1.01, 1.1, 1.5, 3.0):
        assert waste_fraction(tau * factor, cost, mtbf_s, restart_s) >= best - 1e-12
        if tau / factor >= cost.min_interval_s:
            assert waste_fraction(tau / factor, cost, mtbf_s, restart_s) >= best - 1e-12
    if not result.constraint_binding:
        for step in (0.05, 0.2):
            h = step * tau
            if tau - h < cost.min_interval_s:  # left point infeasible (two checkpoints in flight)
                continue
            left = waste_fraction(tau - h, cost, mtbf_s, restart_s)
            right = waste_fraction(tau + h, cost, mtbf_s, restart_s)
            assert left + right >= 2 * best - 1e-12


def test_async_first_order_optimum_is_sqrt_2_s_plus_fP_M() -> None:
    cost = CheckpointCost(stall_s=1, persist_s=60, interference=0.05)
    result = analyse(cost, 3 * HOUR)
    assert result.young_interval_s == pytest.approx(math.sqrt(2 * (1 + 0.05 * 60) * 3 * HOUR))
    assert result.blocking_s == pytest.approx(4.0)


def test_async_exact_model_is_daly_with_effective_cost_and_restart() -> None:
    # E_cycle = M e^((R + (1-f)P)/M) (e^((tau + s + fP)/M) - 1): Daly's sync cycle with C = s + fP, R' = R + (1-f)P.
    asynchronous = CheckpointCost(stall_s=2, persist_s=300, interference=0.1)
    sync = CheckpointCost.sync(2 + 0.1 * 300)
    for tau in (600.0, 1800.0, 7200.0):
        assert cycle_time_s(tau, asynchronous, 6 * HOUR, 600) == pytest.approx(
            cycle_time_s(tau, sync, 6 * HOUR, 600 + 0.9 * 300), rel=1e-12,
        )


def test_sync_is_async_with_nothing_to_persist() -> None:
    sync = analyse(CheckpointCost.sync(140), 3 * HOUR, 600, every_s=1800)
    assert not sync.constraint_binding
    assert sync.min_interval_s == 0
    assert sync.constraint_cost_fraction == 0


def test_constraint_binds_when_persist_is_long() -> None:
    cost = CheckpointCost(stall_s=5, persist_s=20 * MINUTE)  # unconstrained optimum ~ sqrt(2 * 5 * 4h) = 6 min
    result = analyse(cost, 4 * HOUR, 600)
    assert result.constraint_binding
    assert result.exact_interval_s < cost.min_interval_s
    assert result.optimal_interval_s == cost.min_interval_s == 20 * MINUTE
    mtbf, restart = 4 * HOUR, 600.0
    at_bound = waste_fraction(cost.min_interval_s, cost, mtbf, restart)
    assert result.waste_fraction == pytest.approx(at_bound)

    # The waste at the unconstrained optimum, written out (waste_fraction refuses an interval below the bound):
    # 1 - tau / (M e^((R + (1-f)P)/M) (e^((tau + s + fP)/M) - 1)).
    def by_hand(tau: float) -> float:
        cycle = mtbf * math.exp((restart + cost.rollback_s) / mtbf) * math.expm1((tau + cost.blocking_s) / mtbf)
        return 1.0 - tau / cycle

    unconstrained = exact_interval_s(cost.blocking_s, mtbf)
    assert unconstrained < cost.min_interval_s
    assert by_hand(cost.min_interval_s) == pytest.approx(at_bound, rel=1e-12)
    assert result.constraint_cost_fraction == pytest.approx(at_bound - by_hand(unconstrained), rel=1e-9)
    assert result.constraint_cost_fraction > 0


def test_constraint_with_interference_is_one_minus_f_times_persist() -> None:
    cost = CheckpointCost(stall_s=1, persist_s=1000, interference=0.25)
    assert cost.min_interval_s == 750
    with pytest.raises(UsageError, match="two checkpoints in flight"):
        waste_fraction(700, cost, 10 * HOUR)
    with pytest.raises(UsageError, match="two checkpoints in flight"):
        analyse(cost, 10 * HOUR, every_s=700)


def test_overhead_fraction_is_stall_over_interval() -> None:
    assert overhead_fraction(30 * MINUTE, CheckpointCost.sync(140)) == pytest.approx(140 / 1800)
    assert overhead_fraction(30 * MINUTE, CheckpointCost(1, 60, 0.05)) == pytest.approx(4 / 1800)


def test_lost_work_per_failure() -> None:
    assert lost_work_per_failure_s(1800, CheckpointCost.sync(140)) == pytest.approx((1800 + 140) / 2)
    assert lost_work_per_failure_s(1800, CheckpointCost(2, 600, 0.1)) == pytest.approx((1800 + 62) / 2 + 540)


def test_first_order_waste_is_the_expansion_of_the_exact_model() -> None:
    cost = CheckpointCost(stall_s=2, persist_s=120, interference=0.1)
    mtbf, restart, tau = 1e7, 600.0, 3000.0  # tiny tau/M: second-order terms vanish
    exact_per_work = cycle_time_s(tau, cost, mtbf, restart) / tau - 1.0
    assert first_order_waste(tau, cost, mtbf, restart) == pytest.approx(exact_per_work, rel=1e-3)
    assert first_order_waste(tau, cost, mtbf, restart) == pytest.approx(
        (2 + 12) / tau + (tau / 2 + 2 + 120 + restart) / mtbf,
    )


def test_analysis_reports_the_user_interval() -> None:
    cost = CheckpointCost.sync(140)
    result = analyse(cost, 3 * HOUR, 600, every_s=HOUR)
    assert result.interval_s == HOUR
    assert result.overhead_fraction == pytest.approx(140 / 3600)
    assert result.waste_fraction_at_interval == pytest.approx(waste_fraction(HOUR, cost, 3 * HOUR, 600))
    assert result.waste_fraction_at_interval > result.waste_fraction
    assert result.lost_work_per_failure_at_interval_s == pytest.approx((3600 + 140) / 2)
    assert result.failures_per_day == pytest.approx(8)


def test_expected_wall_time_without_failures_is_work_plus_checkpoints() -> None:
    sync = CheckpointCost.sync(60)
    assert expected_wall_time_s(10 * HOUR, HOUR, sync, 1e15) == pytest.approx(10 * HOUR + 10 * 60)
    # async: each checkpoint costs s + fP; the last one also waits (1 - f)P to persist.
    asynchronous = CheckpointCost(stall_s=2, persist_s=300, interference=0.1)
    assert expected_wall_time_s(10 * HOUR, HOUR, asynchronous, 1e15) == pytest.approx(10 * HOUR + 10 * 32 + 270)


def test_expected_wall_time_is_daly_total_for_whole_intervals() -> None:
    # T_w = M e^(R/M) (e^((tau+C)/M) - 1) Ts / tau
    mtbf, restart, tau, ckpt, work = 6 * HOUR, 600.0, 3000.0, 300.0, 500 * 3000.0
    daly = mtbf * math.exp(restart / mtbf) * math.expm1((tau + ckpt) / mtbf) * work / tau
    assert expected_wall_time_s(work, tau, CheckpointCost.sync(ckpt), mtbf, restart) == pytest.approx(daly, rel=1e-12)


def test_work_shorter_than_the_in_flight_bound_is_one_interval_with_one_checkpoint() -> None:
    # 30 min of work, a 1 h persist: one interval of 30 min, below (1 - f) P = 1 h, yet nothing else is
    # in flight beside its single checkpoint. It used to be refused as "two checkpoints in flight".
    cost, mtbf, restart = CheckpointCost(stall_s=1, persist_s=HOUR), 86400.0, 600.0
    assert intervals_for(30 * MINUTE, HOUR, cost.min_interval_s) == 1
    one_segment = mtbf * math.exp(restart / mtbf) * math.expm1((30 * MINUTE + 1 + HOUR) / mtbf)
    assert expected_wall_time_s(30 * MINUTE, HOUR, cost, mtbf, restart) == pytest.approx(one_segment, rel=1e-12)
    # Two intervals or more still keep the bound: 90 min of work is one interval, not two of 45 min.
    assert intervals_for(90 * MINUTE, HOUR, cost.min_interval_s) == 1
    with pytest.raises(UsageError, match="two checkpoints in flight"):
        expected_wall_time_s(90 * MINUTE, 30 * MINUTE, cost, mtbf)


def test_checkpoint_longer_than_mtbf_cannot_keep_up() -> None:
    with pytest.raises(UsageError, match="cannot keep up"):
        check_can_keep_up(CheckpointCost.sync(4 * HOUR), 3 * HOUR)
    with pytest.raises(UsageError, match="cannot keep up"):
        analyse(CheckpointCost.sync(3 * HOUR), 3 * HOUR)
    with pytest.raises(UsageError, match="durable"):
        analyse(CheckpointCost(1, 3 * HOUR), 3 * HOUR)


def test_restart_far_beyond_the_mtbf_is_refused_naming_it() -> None:
    # R/M = 720: e^720 overflows a float; the job would essentially never complete.
    with pytest.raises(UsageError, match=r"restart 12h is 720 times the MTBF \(1m\).*never completes"):
        analyse(CheckpointCost.sync(1), MINUTE, 12 * HOUR)
    # A restart many MTBFs long that can still be computed gives (almost) all waste, not an error.
    assert analyse(CheckpointCost.sync(1), MINUTE, 100 * MINUTE).waste_fraction == pytest.approx(1.0)


def test_interval_far_beyond_the_mtbf_is_refused_naming_it() -> None:
    with pytest.raises(UsageError, match=r"interval 41d 16h is 1,000 times the MTBF \(1h\)"):
        analyse(CheckpointCost.sync(1), HOUR, every_s=1000 * HOUR)
    with pytest.raises(UsageError, match="never completes"):
        waste_fraction(1000 * HOUR, CheckpointCost.sync(1), HOUR)
    with pytest.raises(UsageError, match="never completes"):
        expected_wall_time_s(10_000 * HOUR, 1000 * HOUR, CheckpointCost.sync(1), HOUR)
    # Restarts that cannot fail do not grow exponentially: a long one is computable.
    assert math.isfinite(expected_wall_time_s(10 * HOUR, HOUR, CheckpointCost.sync(1), HOUR, 1000 * HOUR,
                                              restart_can_fail=False))


def test_waste_curve_draws_intervals_past_the_limit_as_all_waste() -> None:
    tau = (MAX_EXPONENT + 10) * HOUR
    [(_, exact, first)] = waste_curve(CheckpointCost.sync(60), HOUR, 0.0, [tau])
    assert exact == 1.0
    assert math.isfinite(first)


def test_one_in_flight_check_allows_the_bound_computed_with_rounding() -> None:
    cost = CheckpointCost(stall_s=1, persist_s=1000, interference=0.25)
    check_in_flight(cost.min_interval_s * (1 - 1e-13), cost)  # the bound, give or take rounding
    with pytest.raises(UsageError, match=r"two checkpoints in flight.*at least \(1 - f\) P = 12m 30s"):
        check_in_flight(cost.min_interval_s * (1 - 1e-9), cost)


@pytest.mark.parametrize(
    "make",
    [
        lambda: CheckpointCost(0),
        lambda: CheckpointCost(-1),
        lambda: CheckpointCost(1, -5),
        lambda: CheckpointCost(1, 10, 1.5),
        lambda: CheckpointCost(1, 0, 0.1),  # interference without a persist phase
        lambda: young_interval_s(0, 100),
        lambda: daly_interval_s(10, -1),
        lambda: waste_fraction(0, CheckpointCost.sync(1), 100),
        lambda: analyse(CheckpointCost.sync(1), 100, restart_s=-1),
        lambda: analyse(CheckpointCost.sync(1), math.inf),
        lambda: CheckpointCost(math.nan),
        lambda: expected_wall_time_s(1e300, 1e-20, CheckpointCost.sync(1), 1e300),  # work / interval overflows
    ],
)
def test_bad_values_are_usage_errors(make) -> None:
    with pytest.raises(UsageError):
        make()


def test_infinite_values_are_called_infinite_not_negative() -> None:
    with pytest.raises(UsageError, match="MTBF .* inf must be finite"):
        analyse(CheckpointCost.sync(1), math.inf)


# -- the optimum as a plateau ----------------------------------------------------------------------


@pytest.mark.parametrize("cost", [model.CheckpointCost.sync(10.5), model.CheckpointCost(0.9, 8.5, 0.02),
                                  model.CheckpointCost(2.0, 600.0, 0.1)])
@pytest.mark.parametrize("mtbf_s", [3 * 3600.0, 86400.0 * 4])
def test_plateau_holds_the_intervals_within_the_tolerance_of_the_minimum(cost, mtbf_s):
    best = model.analyse(cost, mtbf_s, 60.0)
    low, high = model.optimum_plateau(cost, mtbf_s, 60.0)
    assert low <= best.optimal_interval_s <= high
    limit = best.waste_fraction + model.PLATEAU_TOLERANCE
    for tau in (low, high, (low + high) / 2):
        assert model.waste_fraction(tau, cost, mtbf_s, 60.0) <= limit + 1e-9
    if low > cost.min_interval_s:  # just outside either edge the waste exceeds it
        assert model.waste_fraction(low * 0.99, cost, mtbf_s, 60.0) > limit
    assert model.waste_fraction(high * 1.01, cost, mtbf_s, 60.0) > limit


def test_plateau_starts_at_the_one_in_flight_bound_when_it_binds():
    cost = model.CheckpointCost(0.1, 100.0, 0.0)
    assert model.analyse(cost, 1000.0).constraint_binding
    low, high = model.optimum_plateau(cost, 1000.0)
    assert low == cost.min_interval_s and high > low


@pytest.mark.parametrize(("low", "high", "near", "expected"), [
    (1642.0, 4533.0, 2729.0, 3600.0),  # a whole hour fits
    (69.6, 125.9, 93.6, 120.0),  # two minutes fit
    (3700.0, 3900.0, 3800.0, 3900.0),  # 5-minute steps
    (61.5, 61.9, 61.7, 61.7),  # nothing round inside: the optimum itself
])
def test_round_interval_inside_the_plateau(low, high, near, expected):
    assert model.round_interval_s(low, high, near) == pytest.approx(expected)

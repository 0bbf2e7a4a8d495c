"""The Monte Carlo simulator against the closed forms.

Tolerances: the exact models (Daly's full model, and its async form) must agree with the simulated
mean wall time within 1 % (in practice within a few standard errors, ~0.01 %). The first-order
forms (Young's interval, the first-order waste formula, the goodput accounting) drop terms of
relative order (tau + C + R)/M, so they are held to that, stated per test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ckptbench.errors import UsageError
from ckptbench.model.interval import (
    CheckpointCost,
    analyse,
    exact_interval_s,
    expected_wall_time_s,
    first_order_waste,
    young_interval_s,
)
from ckptbench.model.simulate import MAX_SIMULATED_FAILURES, STEP_COST_RUNS, SimulationConfig, simulate

MINUTE, HOUR = 60.0, 3600.0
RUNS = 20_000

CASES = [
    # Daly (2006) Figs. 3 and 4: delta = 5 min, R = 10 min, Ts = 500 h.
    pytest.param(CheckpointCost.sync(5 * MINUTE), 24 * HOUR, 10 * MINUTE, id="daly-fig3-sync"),
    pytest.param(CheckpointCost.sync(5 * MINUTE), 6 * HOUR, 10 * MINUTE, id="daly-fig4-sync"),
    pytest.param(CheckpointCost(stall_s=2, persist_s=5 * MINUTE, interference=0.1), 6 * HOUR, 10 * MINUTE,
                 id="async"),
    pytest.param(CheckpointCost(stall_s=5, persist_s=30 * MINUTE), 4 * HOUR, 10 * MINUTE, id="async-binding"),
]


def _run(cost: CheckpointCost, mtbf: float, restart: float, tau: float, **kwargs) -> tuple[float, float, object]:
    config = SimulationConfig(500 * HOUR, tau, cost, mtbf, restart, runs=kwargs.pop("runs", RUNS), **kwargs)
    result = simulate(config)
    expected = expected_wall_time_s(config.work_s, tau, cost, mtbf, restart,
                                    restart_can_fail=config.restart_can_fail)
    return result.mean_wall_s, expected, result


@pytest.mark.parametrize(("cost", "mtbf", "restart"), CASES)
def test_exact_model_agrees_with_simulation_at_the_optimum(cost: CheckpointCost, mtbf: float, restart: float) -> None:
    tau = analyse(cost, mtbf, restart).optimal_interval_s
    simulated, expected, result = _run(cost, mtbf, restart, tau)
    assert simulated == pytest.approx(expected, rel=0.01)
    assert abs(simulated - expected) < 5 * result.stderr_wall_s  # and within sampling error


@pytest.mark.parametrize(("cost", "mtbf", "restart"), CASES)
def test_exact_model_agrees_with_simulation_away_from_the_optimum(
    cost: CheckpointCost, mtbf: float, restart: float,
) -> None:
    tau = 3 * analyse(cost, mtbf, restart).optimal_interval_s
    simulated, expected, _ = _run(cost, mtbf, restart, tau)
    assert simulated == pytest.approx(expected, rel=0.01)


def test_restarts_that_cannot_fail_agree_with_their_exact_model() -> None:
    cost = CheckpointCost.sync(2 * MINUTE)
    simulated, expected, result = _run(cost, 3 * HOUR, HOUR, 30 * MINUTE, restart_can_fail=False)
    assert simulated == pytest.approx(expected, rel=0.01)
    # and they are cheaper than restarts that start over when they fail
    assert simulated < _run(cost, 3 * HOUR, HOUR, 30 * MINUTE)[0]


def test_simulated_optimum_is_where_the_exact_model_puts_it() -> None:
    # Same seed for every interval (common random numbers): the comparison is between schedules.
    cost, mtbf, restart = CheckpointCost.sync(5 * MINUTE), 6 * HOUR, 10 * MINUTE
    tau = exact_interval_s(cost.stall_s, mtbf)
    walls = {f: _run(cost, mtbf, restart, f * tau, seed=7)[0] for f in (0.5, 1.0, 2.0)}
    assert walls[1.0] < walls[0.5]
    assert walls[1.0] < walls[2.0]


def test_young_is_first_order_but_nearly_as_good() -> None:
    # Young's interval misses the exact optimum by O(sqrt(C/M)) (here 5.8 %), but waste is flat
    # near the optimum: the simulated waste at Young's interval is within sqrt(C/M) = 12 % relative...
    cost, mtbf, restart = CheckpointCost.sync(5 * MINUTE), 6 * HOUR, 10 * MINUTE
    young = young_interval_s(cost.stall_s, mtbf)
    exact = exact_interval_s(cost.stall_s, mtbf)
    assert young / exact - 1 == pytest.approx(0.058, abs=0.002)
    sim_young = _run(cost, mtbf, restart, young, seed=3)[2]
    sim_exact = _run(cost, mtbf, restart, exact, seed=3)[2]
    # ...and in fact within 1 % of the waste at the exact optimum.
    assert sim_young.waste_fraction == pytest.approx(sim_exact.waste_fraction, rel=0.01)


@pytest.mark.parametrize(("cost", "mtbf", "restart"), CASES[:3])
def test_first_order_waste_formula_within_its_order(cost: CheckpointCost, mtbf: float, restart: float) -> None:
    # (s + fP)/tau + (tau/2 + s + P + R)/M drops terms of relative order (tau + C + R)/M.
    tau = analyse(cost, mtbf, restart).optimal_interval_s
    _, _, result = _run(cost, mtbf, restart, tau)
    simulated_per_work = result.mean_wall_s / result.config.work_s - 1.0
    tolerance = (tau + cost.durable_s + restart) / mtbf
    assert first_order_waste(tau, cost, mtbf, restart) == pytest.approx(simulated_per_work, rel=tolerance)


def test_every_second_is_accounted_for() -> None:
    cost = CheckpointCost(stall_s=3, persist_s=200, interference=0.2)
    config = SimulationConfig(100 * HOUR, 20 * MINUTE, cost, 5 * HOUR, 15 * MINUTE, runs=2000, seed=1)
    result = simulate(config)
    total = config.work_s + result.checkpoint_s + result.lost_s + result.restart_s
    np.testing.assert_allclose(result.wall_s, total, rtol=1e-12)
    assert (result.lost_s >= 0).all() and (result.restart_s >= 0).all()
    assert result.breakdown_s()["work"] == config.work_s


def test_no_failures_means_work_plus_checkpoints() -> None:
    cost = CheckpointCost.sync(60)
    result = simulate(SimulationConfig(10 * HOUR, HOUR, cost, 1e15, 600, runs=100))
    assert (result.failures == 0).all()
    np.testing.assert_allclose(result.wall_s, 10 * HOUR + 10 * 60)


def test_restart_time_is_counted_per_failure() -> None:
    # With failures only possible while running, each failure costs exactly one restart.
    cost = CheckpointCost.sync(60)
    result = simulate(SimulationConfig(50 * HOUR, HOUR, cost, 5 * HOUR, 600, runs=1000, restart_can_fail=False))
    np.testing.assert_allclose(result.restart_s, 600 * result.failures)


def test_seeded_runs_are_reproducible() -> None:
    config = SimulationConfig(50 * HOUR, HOUR, CheckpointCost.sync(60), 5 * HOUR, 600, runs=500, seed=42)
    np.testing.assert_array_equal(simulate(config).wall_s, simulate(config).wall_s)
    other = SimulationConfig(50 * HOUR, HOUR, CheckpointCost.sync(60), 5 * HOUR, 600, runs=500, seed=43)
    assert not np.array_equal(simulate(config).wall_s, simulate(other).wall_s)


@pytest.mark.parametrize("shape", [0.7, 1.0, 2.0])
def test_weibull_failures_keep_the_mtbf(shape: float) -> None:
    # Renewal theorem: failures per unit wall time -> 1 / MTBF whatever the shape.
    mtbf = 5 * HOUR
    config = SimulationConfig(2000 * HOUR, HOUR, CheckpointCost.sync(60), mtbf, 600, weibull_shape=shape,
                              runs=500, seed=5)
    result = simulate(config)
    rate = result.failures.sum() / result.wall_s.sum()
    assert rate * mtbf == pytest.approx(1.0, rel=0.02)


def test_weibull_shape_one_is_exponential() -> None:
    cost, mtbf = CheckpointCost.sync(120), 4 * HOUR
    config = SimulationConfig(300 * HOUR, HOUR, cost, mtbf, 600, weibull_shape=1.0 + 1e-9, runs=5000, seed=9)
    expected = expected_wall_time_s(300 * HOUR, HOUR, cost, mtbf, 600)
    assert simulate(config).mean_wall_s == pytest.approx(expected, rel=0.01)


def test_bursty_failures_differ_from_exponential() -> None:
    # Clustered failures (shape < 1) hit the same interval repeatedly: the closed forms, which assume
    # exponential failures, are then only a guide. The simulator shows by how much.
    cost, mtbf = CheckpointCost.sync(120), 4 * HOUR
    exponential = simulate(SimulationConfig(300 * HOUR, HOUR, cost, mtbf, 600, runs=5000, seed=9))
    bursty = simulate(SimulationConfig(300 * HOUR, HOUR, cost, mtbf, 600, weibull_shape=0.5, runs=5000, seed=9))
    assert abs(bursty.mean_wall_s / exponential.mean_wall_s - 1) > 0.01


def test_intervals_split_the_work_evenly_and_respect_the_in_flight_bound() -> None:
    config = SimulationConfig(10 * HOUR, 0.9 * HOUR, CheckpointCost.sync(60), 5 * HOUR)
    assert config.checkpoints == 12
    assert config.used_interval_s == pytest.approx(10 * HOUR / 12)
    bound = CheckpointCost(stall_s=1, persist_s=1000)
    config = SimulationConfig(10_500, 1000, bound, 5 * HOUR)  # ceil would give 11 intervals of 954.5 s
    assert config.used_interval_s >= bound.min_interval_s


def test_bad_configs_are_usage_errors() -> None:
    # the interval model's one-in-flight check and message
    with pytest.raises(UsageError, match=r"two checkpoints in flight.*at least \(1 - f\) P = 16m 40s"):
        SimulationConfig(10 * HOUR, 500, CheckpointCost(1, 1000), 5 * HOUR)
    with pytest.raises(UsageError, match="runs"):
        SimulationConfig(10 * HOUR, HOUR, CheckpointCost.sync(60), 5 * HOUR, runs=0)
    with pytest.raises(UsageError, match="cannot keep up"):
        SimulationConfig(1000 * HOUR, HOUR, CheckpointCost.sync(600), 60, runs=10)
    with pytest.raises(UsageError, match=r"1e\+26 checkpoints per run"):  # would overflow numpy's int64
        SimulationConfig(1e17, 1e-9, CheckpointCost.sync(1e-9), 1e18, runs=10)


def test_the_total_work_of_a_simulation_is_bounded_not_just_failures_per_run() -> None:
    # 2h checkpoints, 3h MTBF, 2h restarts, 300 days: ~20,000 failures per run (under the old per-run cap),
    # ~2e9 for 100,000 runs. Refused when the config is made, before anything runs.
    cost, mtbf, restart, work = CheckpointCost.sync(2 * HOUR), 3 * HOUR, 2 * HOUR, 300 * 24 * HOUR
    tau = analyse(cost, mtbf, restart).optimal_interval_s
    with pytest.raises(UsageError, match=r"100,000 simulated runs of 300d .* \d\.\d+e\+09 in all") as info:
        SimulationConfig(work, tau, cost, mtbf, restart, runs=100_000)
    assert "fewer runs (--simulate) or a shorter run (--work)" in str(info.value)
    # The same run fits when there are fewer of them.
    config = SimulationConfig(work, tau, cost, mtbf, restart, runs=100)
    per_run = config.expected_wall_s() / mtbf
    assert (config.runs + STEP_COST_RUNS) * (per_run + 1) <= MAX_SIMULATED_FAILURES


def test_runs_that_never_finish_are_stopped_with_a_reason(monkeypatch) -> None:
    # Weibull shape 50: failures come almost exactly every MTBF (3.1 h), so a 6 h segment (3 h interval
    # + 3 h persist) never completes. The exponential estimate (~1,000 failures) passes the size check.
    import ckptbench.model.simulate as simulate_module

    monkeypatch.setattr(simulate_module, "MAX_SIMULATED_FAILURES", 2_000_000)  # keep the test short
    cost = CheckpointCost(stall_s=1e-6, persist_s=3 * HOUR)
    config = SimulationConfig(30 * 24 * HOUR, 3 * HOUR, cost, 3.09 * HOUR, weibull_shape=50, runs=5)
    with pytest.raises(UsageError, match="5 of 5 simulated runs had not finished.*Weibull shape 50"):
        simulate(config)


def test_exponential_runs_far_past_the_mean_failure_count_still_finish(monkeypatch) -> None:
    # One 3-MTBF segment per run: failure counts are geometric, mean e^3 - 1 = 19, and about one run in
    # nine needs more than twice that. With the budget just fitting, the old cap (twice the budget in
    # whole steps, i.e. about twice the mean failure count) refused this, blaming "Weibull shape 1".
    import ckptbench.model.simulate as simulate_module

    cost, mtbf, work, runs = CheckpointCost.sync(1), 1000.0, 3000.0, 2000
    per_run = expected_wall_time_s(work, work, cost, mtbf) / mtbf
    budget = math.ceil((runs + STEP_COST_RUNS) * (per_run + 1))
    monkeypatch.setattr(simulate_module, "MAX_SIMULATED_FAILURES", budget)
    result = simulate(SimulationConfig(work, work, cost, mtbf, runs=runs, seed=5))
    old_cap = 2 * budget // (runs + STEP_COST_RUNS)
    assert result.failures.max() > old_cap
    assert abs(result.mean_wall_s - result.config.expected_wall_s()) < 5 * result.stderr_wall_s


def test_work_shorter_than_the_in_flight_bound_is_simulated_as_one_interval() -> None:
    # 30 min of work with a 1 h persist: one checkpoint, nothing to overlap; it used to be refused.
    cost = CheckpointCost(stall_s=1, persist_s=HOUR)
    config = SimulationConfig(30 * MINUTE, HOUR, cost, 2 * HOUR, 5 * MINUTE, runs=RUNS, seed=2)
    assert (config.checkpoints, config.used_interval_s) == (1, 30 * MINUTE)
    result = simulate(config)
    assert abs(result.mean_wall_s - config.expected_wall_s()) < 5 * result.stderr_wall_s


def test_weibull_shapes_and_run_counts_that_cannot_be_computed_are_usage_errors() -> None:
    # Gamma(1 + 1/k) overflowed (OverflowError) for k = 0.001; 10^400 runs overflowed the budget's float.
    with pytest.raises(UsageError, match="Weibull shape 0.001 is below 0.1"):
        SimulationConfig(10 * HOUR, HOUR, CheckpointCost.sync(60), 5 * HOUR, weibull_shape=0.001)
    with pytest.raises(UsageError, match="simulated runs about 10\\^400 is more than 100,000,000"):
        SimulationConfig(10 * HOUR, HOUR, CheckpointCost.sync(60), 5 * HOUR, runs=10**400)


def test_hundred_thousand_runs_are_vectorised() -> None:
    # Behaviour, not timing: 10^5 runs come back with one wall time each and a tiny standard error.
    cost, mtbf = CheckpointCost.sync(140), 3 * HOUR
    tau = exact_interval_s(140, mtbf)
    result = simulate(SimulationConfig(100 * HOUR, tau, cost, mtbf, 600, runs=100_000, seed=11))
    assert result.wall_s.shape == (100_000,)
    expected = expected_wall_time_s(100 * HOUR, tau, cost, mtbf, 600)
    assert result.stderr_wall_s / expected < 2e-4
    assert math.isclose(result.mean_wall_s, expected, rel_tol=1e-3)

"""Two-level checkpointing: the exact model, its numeric optimum and Benoit's first order against the Monte Carlo.

Tolerances: the exact model must agree with the simulated mean wall time within 1 % and within 3
standard errors (|z| < 3, the z-score in every assertion message). Benoit's first-order closed form
drops terms of relative order (tau + C + R)/M: its waste is held to 1 % of wall time (one percentage
point) of the simulation where the waste is small enough for a first-order form (under about 10 %),
and its schedule, evaluated exactly, to within 0.2 percentage point of the numeric optimum everywhere.
"""

from __future__ import annotations

import math

import pytest

from ckptbench.errors import UsageError
from ckptbench.model import twolevel
from ckptbench.model.interval import PLATEAU_TOLERANCE, CheckpointCost, cycle_time_s
from ckptbench.model.simulate_twolevel import TwoLevelSimulationConfig, simulate

MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
RUNS = 2_000
WORK = 30 * DAY


def _cost(local: CheckpointCost, drain: float, drain_f: float, r1: float, r2: float, q: float) -> twolevel.TwoLevelCost:
    return twolevel.TwoLevelCost(local, drain, drain_f, r1, r2, q)


ASYNC = CheckpointCost(stall_s=2, persist_s=60, interference=0.02)
#: (cost, MTBF): async and sync local tiers, local losses from 5 % to 90 %, MTBFs from 2 h to a day.
CASES = {
    "async-q30-6h": (_cost(ASYNC, 10 * MINUTE, 0.02, 5 * MINUTE, 15 * MINUTE, 0.3), 6 * HOUR),
    "async-q10-24h": (_cost(ASYNC, 10 * MINUTE, 0.02, 5 * MINUTE, 15 * MINUTE, 0.1), 24 * HOUR),
    "sync-llama3-3h": (_cost(CheckpointCost.sync(30), 20 * MINUTE, 0.02, 2 * MINUTE, 30 * MINUTE, 0.675), 3 * HOUR),
    "async-q90-12h": (_cost(CheckpointCost(5, 5 * MINUTE, 0.05), 30 * MINUTE, 0.05, 10 * MINUTE, 20 * MINUTE, 0.9),
                      12 * HOUR),
    "sync-q50-2h": (_cost(CheckpointCost.sync(10), 5 * MINUTE, 0.1, 1 * MINUTE, 10 * MINUTE, 0.5), 2 * HOUR),
    "async-q5-4h": (_cost(CheckpointCost(1, 2 * MINUTE, 0.02), 15 * MINUTE, 0.02, 3 * MINUTE, 20 * MINUTE, 0.05),
                    4 * HOUR),
    "sync-llama3-24h": (_cost(CheckpointCost.sync(20), 10 * MINUTE, 0.02, 2 * MINUTE, 10 * MINUTE, 0.675), 24 * HOUR),
    "async-q30-12h": (_cost(CheckpointCost(1, 30, 0.02), 5 * MINUTE, 0.02, 1 * MINUTE, 5 * MINUTE, 0.3), 12 * HOUR),
}
#: The cases whose optimal waste is small enough (under about 10 %) for a first-order form.
FIRST_ORDER_CASES = ["async-q30-6h", "async-q10-24h", "async-q5-4h", "sync-llama3-24h", "async-q30-12h"]


def _simulate(cost: twolevel.TwoLevelCost, mtbf: float, tau: float, every: int, seed: int = 1, **kwargs):
    config = TwoLevelSimulationConfig(WORK, tau, every, cost, mtbf, runs=kwargs.pop("runs", RUNS), seed=seed, **kwargs)
    return config, simulate(config)


@pytest.mark.parametrize("name", list(CASES))
def test_exact_model_agrees_with_simulation_at_the_numeric_optimum(name: str) -> None:
    cost, mtbf = CASES[name]
    tau, every, waste = twolevel.optimise(cost, mtbf)
    config, result = _simulate(cost, mtbf, tau, every)
    z = result.z_score()
    message = (f"{name}: tau {tau:.0f} s, every {every}: model waste {waste:.5f}, simulated "
               f"{result.waste_fraction:.5f} +- {result.stderr_waste_fraction:.5f}, z = {z:+.2f}")
    assert abs(z) < 3, message
    assert result.mean_wall_s == pytest.approx(config.expected_wall_s(), rel=0.01), message
    assert result.waste_fraction == pytest.approx(waste, abs=5 * result.stderr_waste_fraction + 1e-4), message


@pytest.mark.parametrize("name", list(CASES))
def test_exact_model_agrees_with_simulation_away_from_the_optimum(name: str) -> None:
    cost, mtbf = CASES[name]
    tau, every, _ = twolevel.optimise(cost, mtbf)
    far_every = every + 3
    far_tau = max(2.5 * tau, cost.min_interval_s(far_every))
    config, result = _simulate(cost, mtbf, far_tau, far_every, seed=2)
    z = result.z_score()
    assert abs(z) < 3, f"{name}: tau {far_tau:.0f} s, every {far_every}: z = {z:+.2f}"
    assert result.mean_wall_s == pytest.approx(config.expected_wall_s(), rel=0.01), f"z = {z:+.2f}"


@pytest.mark.parametrize("name", FIRST_ORDER_CASES)
def test_benoit_first_order_waste_is_within_one_point_of_the_simulation(name: str) -> None:
    cost, mtbf = CASES[name]
    benoit = twolevel.benoit_optimum(cost, mtbf)
    config, result = _simulate(cost, mtbf, benoit.interval_s, benoit.every, seed=3)
    z = result.z_score()
    gap = benoit.waste_fraction_first_order - result.waste_fraction
    message = (f"{name}: Benoit tau {benoit.interval_s:.0f} s, every {benoit.every}: first order "
               f"{benoit.waste_fraction_first_order:.5f}, simulated {result.waste_fraction:.5f} (gap {gap:+.5f}); "
               f"exact model z = {z:+.2f}")
    assert abs(gap) < 0.01, message
    assert abs(z) < 3, message


@pytest.mark.parametrize("name", list(CASES))
def test_exact_model_agrees_with_simulation_at_the_benoit_schedule(name: str) -> None:
    cost, mtbf = CASES[name]
    benoit = twolevel.benoit_optimum(cost, mtbf)
    config, result = _simulate(cost, mtbf, benoit.interval_s, benoit.every, seed=6)
    z = result.z_score()
    message = (f"{name}: Benoit tau {benoit.interval_s:.0f} s, every {benoit.every}: exact "
               f"{benoit.waste_fraction_exact:.5f}, simulated {result.waste_fraction:.5f}, z = {z:+.2f}")
    assert abs(z) < 3, message
    assert result.mean_wall_s == pytest.approx(config.expected_wall_s(), rel=0.01), message


@pytest.mark.parametrize("name", list(CASES))
def test_benoit_schedule_is_nearly_as_good_as_the_numeric_optimum(name: str) -> None:
    cost, mtbf = CASES[name]
    _, every, waste = twolevel.optimise(cost, mtbf)
    benoit = twolevel.benoit_optimum(cost, mtbf)
    assert benoit.waste_fraction_exact >= waste - 1e-9  # the numeric optimum is the optimum
    assert benoit.waste_fraction_exact - waste < 0.002, f"{name}: Benoit every {benoit.every}, numeric {every}"


def test_the_numeric_optimum_beats_its_neighbours_in_simulation() -> None:
    cost, mtbf = CASES["async-q30-6h"]
    tau, every, _ = twolevel.optimise(cost, mtbf)
    _, best = _simulate(cost, mtbf, tau, every, seed=4, runs=4000)
    for other_tau, other_every in ((tau / 2.5, every), (tau * 2.5, every), (tau, every + 4)):
        other_tau = max(other_tau, cost.min_interval_s(other_every))
        _, other = _simulate(cost, mtbf, other_tau, other_every, seed=4, runs=4000)
        noise = 3 * math.hypot(best.stderr_waste_fraction, other.stderr_waste_fraction)
        assert best.waste_fraction < other.waste_fraction + noise, (other_tau, other_every)
    # and in the model, every neighbouring k does no better at its own best interval
    for k in (max(1, every - 1), every + 1):
        assert twolevel._best_interval(k, cost, mtbf)[1] >= twolevel.optimise(cost, mtbf)[2] - 1e-12


def test_no_local_loss_is_local_only_single_level() -> None:
    cost = _cost(ASYNC, 10 * MINUTE, 0.0, 5 * MINUTE, 15 * MINUTE, 0.0)
    mtbf = 6 * HOUR
    for every in (1, 3, 10):
        assert twolevel.group_time_s(1800, every, cost, mtbf) == pytest.approx(
            every * cycle_time_s(1800, ASYNC, mtbf, 5 * MINUTE), rel=1e-12)
    # a vanishing local loss converges to the same
    tiny = _cost(ASYNC, 10 * MINUTE, 0.0, 5 * MINUTE, 15 * MINUTE, 1e-9)
    assert twolevel.group_time_s(1800, 3, tiny, mtbf) == pytest.approx(
        3 * cycle_time_s(1800, ASYNC, mtbf, 5 * MINUTE), rel=1e-6)
    analysis = twolevel.analyse(cost, mtbf)
    assert analysis.schedule == "local-only"
    assert analysis.every is None


def test_total_local_loss_is_single_level_from_remote() -> None:
    cost = _cost(ASYNC, 10 * MINUTE, 0.02, 5 * MINUTE, 15 * MINUTE, 1.0)
    mtbf = 6 * HOUR
    # k = 1: one segment of tau + c1 + c2 restarting from remote after r2, Daly's model exactly
    single = CheckpointCost.sync(cost.c1_s + cost.c2_s)
    assert twolevel.group_time_s(1800, 1, cost, mtbf) == pytest.approx(
        cycle_time_s(1800, single, mtbf, cost.remote_recovery_s), rel=1e-12)
    analysis = twolevel.analyse(cost, mtbf)
    assert analysis.schedule == "remote-only"  # the local tier only costs
    assert analysis.every == 1
    assert analysis.single_level_waste_fraction < analysis.waste_fraction


def test_more_local_loss_never_helps_and_the_remote_period_shrinks() -> None:
    mtbf = 6 * HOUR
    results = [twolevel.analyse(_cost(ASYNC, 10 * MINUTE, 0.02, 5 * MINUTE, 15 * MINUTE, q), mtbf)
               for q in (0.05, 0.2, 0.5, 0.9)]
    wastes = [r.waste_fraction for r in results]
    everies = [r.every for r in results]
    assert wastes == sorted(wastes)
    assert everies == sorted(everies, reverse=True)
    assert everies[0] > everies[-1]


def test_plateau_and_ties_hold_the_optimum() -> None:
    cost, mtbf = CASES["async-q30-6h"]
    analysis = twolevel.analyse(cost, mtbf)
    low, high = analysis.interval_plateau_s
    assert low <= analysis.interval_s <= high
    assert low <= analysis.recommended_interval_s <= high
    assert analysis.recommended_interval_s % 60 == 0  # a round value
    assert twolevel.waste_fraction(low, analysis.every, cost, mtbf) <= analysis.waste_fraction + PLATEAU_TOLERANCE + 1e-9
    assert twolevel.waste_fraction(high * 1.05, analysis.every, cost, mtbf) > analysis.waste_fraction + PLATEAU_TOLERANCE
    k_low, k_high = analysis.every_tied
    assert k_low <= analysis.every <= k_high
    assert twolevel._best_interval(k_high + 1, cost, mtbf)[1] > analysis.waste_fraction + PLATEAU_TOLERANCE
    if k_low > 1:
        assert twolevel._best_interval(k_low - 1, cost, mtbf)[1] > analysis.waste_fraction + PLATEAU_TOLERANCE


def test_benoit_closed_form_matches_its_definition() -> None:
    cost, mtbf = CASES["async-q10-24h"]
    lam1, lam2 = 0.9 / mtbf, 0.1 / mtbf
    assert twolevel.benoit_every(cost, mtbf) == pytest.approx(math.sqrt(cost.c2_s * lam1 / (cost.c1_s * lam2)))
    k = twolevel.benoit_optimum(cost, mtbf).every
    tau = twolevel.benoit_interval_s(k, cost, mtbf)
    # the first-order overhead is minimal in tau at tau_k
    h = twolevel.first_order_overhead(tau, k, cost, mtbf)
    assert h < twolevel.first_order_overhead(tau * 1.01, k, cost, mtbf)
    assert h < twolevel.first_order_overhead(tau * 0.99, k, cost, mtbf)
    # and at the continuous optimum it is the sum of sqrt(2 lambda_l C_l) plus the restarts
    tau_star = math.sqrt(2 * cost.c1_s / lam1)
    k_star = math.sqrt(2 * cost.c2_s / lam2) / tau_star
    overhead = (lam1 * (tau_star / 2) + cost.c1_s / tau_star + cost.c2_s / (k_star * tau_star)
                + lam2 * k_star * tau_star / 2)
    assert overhead == pytest.approx(math.sqrt(2 * lam1 * cost.c1_s) + math.sqrt(2 * lam2 * cost.c2_s))


def test_peer_replica_makes_losses_rare() -> None:
    mtbf, window = 3 * HOUR, 5 * MINUTE
    q = 0.675
    q_peer = twolevel.peer_replica_loss(q, mtbf, 2048, window)
    assert q_peer == pytest.approx(q * (1 - math.exp(-q * window / (mtbf * 2048))))
    assert 0 < q_peer < q / 1000
    assert twolevel.peer_replica_loss(q, mtbf, 16, window) > q_peer  # fewer nodes: a peer loss is likelier
    with pytest.raises(UsageError):
        twolevel.peer_replica_loss(q, mtbf, 1, window)
    base = _cost(ASYNC, 10 * MINUTE, 0.02, 5 * MINUTE, 15 * MINUTE, q)
    replicated = _cost(ASYNC, 10 * MINUTE, 0.02, 5 * MINUTE, 15 * MINUTE, q_peer)
    assert twolevel.analyse(replicated, mtbf).waste_fraction < twolevel.analyse(base, mtbf).waste_fraction


def test_weibull_failures_keep_the_mtbf_and_burstier_ones_change_the_waste() -> None:
    cost, mtbf = CASES["async-q30-6h"]
    tau, every, _ = twolevel.optimise(cost, mtbf)
    _, exponential = _simulate(cost, mtbf, tau, every, seed=5)
    _, bursty = _simulate(cost, mtbf, tau, every, seed=5, weibull_shape=0.6)
    per_run = bursty.failures.mean()
    assert per_run == pytest.approx(bursty.mean_wall_s / mtbf, rel=0.05)  # renewal: failures ~ wall / MTBF
    noise = 3 * math.hypot(exponential.stderr_waste_fraction, bursty.stderr_waste_fraction)
    assert abs(bursty.waste_fraction - exponential.waste_fraction) > noise
    assert 0 < bursty.remote_restarts.mean() < per_run


def test_simulation_is_reproducible_and_counts_remote_restarts() -> None:
    cost, mtbf = CASES["sync-q50-2h"]
    tau, every, _ = twolevel.optimise(cost, mtbf)
    _, a = _simulate(cost, mtbf, tau, every, seed=7, runs=200)
    _, b = _simulate(cost, mtbf, tau, every, seed=7, runs=200)
    assert (a.wall_s == b.wall_s).all()
    share = a.remote_restarts.sum() / a.failures.sum()
    assert 0.35 < share < 0.7  # about q = 0.5, plus failures during remote recoveries


def test_no_failures_means_work_plus_checkpoints_and_drains() -> None:
    cost = _cost(ASYNC, 10 * MINUTE, 0.02, 5 * MINUTE, 15 * MINUTE, 0.3)
    mtbf = 1e12  # no failure within the run
    config, result = _simulate(cost, mtbf, 1800, 4, runs=10)
    groups = config.groups
    assert result.wall_s == pytest.approx(groups * (4 * (1800 + cost.c1_s) + cost.c2_s))
    assert (result.failures == 0).all()


def test_bad_schedules_are_usage_errors() -> None:
    cost, mtbf = CASES["async-q30-6h"]
    with pytest.raises(UsageError, match="two drains in flight"):
        twolevel.waste_fraction(60, 1, cost, mtbf)  # a 10-minute drain cannot finish every minute
    with pytest.raises(UsageError):
        twolevel.waste_fraction(1800, 0, cost, mtbf)
    with pytest.raises(UsageError):
        _cost(ASYNC, 10 * MINUTE, 0.02, 5 * MINUTE, 15 * MINUTE, 1.5)
    with pytest.raises(UsageError):
        twolevel.optimise(_cost(ASYNC, 10 * MINUTE, 0.02, 5 * MINUTE, 15 * MINUTE, 0.0), mtbf)
    with pytest.raises(UsageError, match="more than the simulator handles"):
        TwoLevelSimulationConfig(1e9 * DAY, 1800, 3, cost, mtbf, runs=10_000)

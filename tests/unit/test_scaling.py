"""From a sample to the node's size: a fixed part plus a per-byte part, fitted over the sizes nearest the
node's bytes; how far up a sample may go."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptbench.decide.scaling import (
    affordable_runs,
    extended_size,
    fit_sizes,
    fit_time,
    line_time_s,
    next_median_half_width,
    robust_scale,
    widen_end,
)

MiB = 2**20


def test_a_fixed_cost_is_not_scaled_with_the_bytes():
    # 0.1 s fixed + 1 GB/s: 0.234 s at 128 MiB, 0.637 s at 512 MiB; the node writes 5 GiB
    small, large, node = 128 * MiB, 512 * MiB, 5 * 1024 * MiB
    t = line_time_s(small, 0.1 + small / 1e9, large, 0.1 + large / 1e9, node)
    assert t == pytest.approx(0.1 + node / 1e9)
    proportional = (0.1 + large / 1e9) * node / large
    assert proportional > 1.1 * t  # one size scaled in proportion overstates it


def test_noise_that_makes_the_line_fall_or_cross_zero():
    # falling: the time of the size nearer the target stands (beyond both: the larger size's)
    assert line_time_s(100, 0.5, 400, 0.4, 4000) == 0.4
    assert line_time_s(100, 0.5, 400, 0.4, 150) == 0.5
    assert line_time_s(100, 0.5, 400, 0.4, 4000, min_slope=1e-4) == pytest.approx(0.4 + 3600 * 1e-4)
    assert line_time_s(100, 0.01, 400, 0.4, 4000) == pytest.approx(0.4 * 10)  # fixed < 0: in proportion
    with pytest.raises(ValueError):
        line_time_s(400, 0.4, 100, 0.1, 1000)


def test_the_range_covers_every_line_through_extreme_runs_and_the_runs_made_again():
    fitted = fit_time(100, [0.10, 0.12, 0.11], 400, [0.40, 0.46, 0.43], 1000)
    assert fitted.low_s <= fitted.point_s <= fitted.high_s
    assert fitted.low_s <= line_time_s(100, 0.12, 400, 0.40, 1000)
    assert fitted.high_s >= line_time_s(100, 0.10, 400, 0.46, 1000)
    # the 90 % interval of both sizes' medians made again, carried along the line (weights -2 and 3 at 1000)
    half = ((-2 * next_median_half_width([0.10, 0.12, 0.11])) ** 2
            + (3 * next_median_half_width([0.40, 0.46, 0.43])) ** 2) ** 0.5
    assert fitted.high_s == pytest.approx(max(line_time_s(100, 0.10, 400, 0.46, 1000), fitted.point_s + half))


def test_the_interval_of_a_median_made_again():
    # three runs 1, 2, 3 s: s = 1, Student's t(2) = 2.920, two medians differ by about s * sqrt(pi / 3)
    assert next_median_half_width([1.0, 2.0, 3.0]) == pytest.approx(2.920 * (3.141592653589793 / 3) ** 0.5, rel=1e-3)
    assert next_median_half_width([2.0]) == 0.0
    assert next_median_half_width([2.0, 2.0, 2.0]) == 0.0
    # more runs, a narrower interval for the same spread
    assert next_median_half_width([1.0, 2.0, 3.0] * 4) < next_median_half_width([1.0, 2.0, 3.0])


def test_one_slow_run_does_not_blow_up_the_interval_of_the_median():
    # three stalls, one slow: the runs' standard deviation (0.087) would give a half width of 0.26 s, below
    # zero on the low side; the middle runs' spread (MAD 0.01 -> 0.0148) gives 0.044 s
    runs = [0.09, 0.10, 0.25]
    assert robust_scale(runs) == pytest.approx(1.4826 * 0.01)
    assert next_median_half_width(runs) == pytest.approx(2.920 * 1.4826 * 0.01 * (3.141592653589793 / 3) ** 0.5)
    # the range still reaches every run: the slow one is its high end
    f = fit_sizes([1000 * MiB], [runs], 1000 * MiB)
    assert f.low_s == pytest.approx(0.10 - next_median_half_width(runs)) and f.high_s == pytest.approx(0.25)
    # evenly spread runs keep their standard deviation (the smaller of the two), and two runs have no middle
    assert robust_scale([1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert robust_scale([1.0, 3.0]) == pytest.approx(2**0.5)


runs = st.lists(st.floats(min_value=1e-3, max_value=10.0), min_size=1, max_size=5)


@given(runs, runs, st.floats(min_value=1.0, max_value=1e3))
def test_fitted_times_are_positive_and_ordered(small_runs, large_runs, scale):
    f = fit_time(1e6, small_runs, 4e6, large_runs, 4e6 * scale)
    assert 0 < f.low_s <= f.point_s <= f.high_s


def test_the_line_goes_through_the_two_sizes_nearest_the_target():
    # concave: per-tensor costs weigh at the small size, so its slope overstates the large sizes'
    sizes = [128 * MiB, 512 * MiB, 2048 * MiB]
    runs = [[0.30], [0.70], [1.90]]
    beyond = fit_sizes(sizes, runs, 4096 * MiB)
    assert beyond.point_s == pytest.approx(line_time_s(512 * MiB, 0.70, 2048 * MiB, 1.90, 4096 * MiB))
    assert beyond.point_s < line_time_s(128 * MiB, 0.30, 512 * MiB, 0.70, 4096 * MiB)
    between = fit_sizes(sizes, runs, 1024 * MiB)
    assert between.point_s == pytest.approx(line_time_s(512 * MiB, 0.70, 2048 * MiB, 1.90, 1024 * MiB))
    below = fit_sizes(sizes, runs, 256 * MiB)
    assert below.point_s == pytest.approx(line_time_s(128 * MiB, 0.30, 512 * MiB, 0.70, 256 * MiB))
    # the order the sizes come in does not matter
    assert fit_sizes(sizes[::-1], runs[::-1], 4096 * MiB) == beyond


def test_the_range_starts_no_lower_than_a_smaller_sizes_fastest_run():
    # a noisy stall: the interval of the runs made again would reach zero; 1 GiB took at least 0.19 s
    f = fit_sizes([512 * MiB, 1024 * MiB], [[0.18, 0.05, 0.30], [0.19, 0.40, 0.21]], 4096 * MiB)
    assert f.low_s == pytest.approx(0.19) and f.point_s >= 0.19
    same = fit_sizes([1024 * MiB], [[0.19, 0.40, 0.21]], 1024 * MiB)  # the target's own size: no such floor
    assert same.low_s < 0.19
    # measured at the target too: a smaller size's slower runs (noise) do not lift the range above the target's own
    both = fit_sizes([256 * MiB, 1024 * MiB], [[0.25, 0.26], [0.19, 0.40, 0.21]], 1024 * MiB)
    assert both.low_s < 0.19


def test_a_size_at_the_target_is_read_as_measured():
    runs = [[0.30, 0.34], [1.0, 1.2, 1.1], [4.0, 4.4, 3.8]]
    f = fit_sizes([100 * MiB, 400 * MiB, 1000 * MiB], runs, 1020 * MiB)  # 2 % off: that size's runs, in proportion
    half = next_median_half_width(runs[2]) * 1.02
    assert (f.point_s, f.low_s, f.high_s) == pytest.approx((4.0 * 1.02, 4.0 * 1.02 - half, 4.0 * 1.02 + half))
    assert f.low_s < 3.8 * 1.02 and f.high_s > 4.4 * 1.02  # wider than the runs' own min and max
    one = fit_sizes([400 * MiB], [[1.0, 1.2]], 800 * MiB)  # one size: in proportion
    assert one.point_s == pytest.approx(2.2) and one.low_s < 2.0 and one.high_s > 2.4
    steady = fit_sizes([400 * MiB], [[1.0, 1.0, 1.0]], 400 * MiB)  # no spread: the runs are the range
    assert (steady.point_s, steady.low_s, steady.high_s) == pytest.approx((1.0, 1.0, 1.0))
    with pytest.raises(ValueError):
        fit_sizes([1, 2], [[1.0]], 3)


def test_the_extended_size_is_bounded_by_the_target_memory_time_and_workload():
    GiB = 1024 * MiB
    kw = {"runs": 4, "copies": 3, "most_bytes": 100 * GiB}
    # plenty of everything: the node's own bytes
    assert extended_size(4 * GiB, 512 * MiB, 1.0, memory_bytes=64 * GiB, budget_s=600, **kw) == 4 * GiB
    # memory: 3 copies of 6 GiB fit in 18 GiB
    assert extended_size(16 * GiB, 512 * MiB, 1.0, memory_bytes=18 * GiB, budget_s=600, **kw) == 6 * GiB
    # time: 1 s per run at 512 MiB, 4 runs in 30 s -> 7.5 s per run -> 3.75 GiB
    assert extended_size(16 * GiB, 512 * MiB, 1.0, memory_bytes=64 * GiB, budget_s=30, **kw) == int(3.75 * GiB)
    # the workload's largest
    assert extended_size(16 * GiB, 512 * MiB, 1.0, memory_bytes=64 * GiB, budget_s=600, runs=4, copies=3,
                         most_bytes=2 * GiB) == 2 * GiB
    # not worth it below 1.5x the sample
    assert extended_size(700 * MiB, 512 * MiB, 1.0, memory_bytes=64 * GiB, budget_s=600, **kw) is None
    assert extended_size(16 * GiB, 512 * MiB, 10.0, memory_bytes=64 * GiB, budget_s=30, **kw) is None
    with pytest.raises(ValueError):
        extended_size(16 * GiB, 0, 1.0, memory_bytes=64 * GiB, budget_s=30, **kw)


def test_a_line_flattened_by_noise_goes_no_faster_than_the_floor():
    # the larger sample took hardly longer than the smaller: the bare line reads a node of 14 GB at 35 GB/s
    GB = 1e9
    bare = line_time_s(0.032 * GB, 0.249, 0.128 * GB, 0.25, 14 * GB)
    assert 14 * GB / bare > 20 * GB
    floored = line_time_s(0.032 * GB, 0.249, 0.128 * GB, 0.25, 14 * GB, min_slope=1 / (2 * GB))
    assert floored == pytest.approx(0.25 + (14 - 0.128) / 2)
    # a steeper line than the floor is left alone
    steep = line_time_s(0.032 * GB, 0.05, 0.128 * GB, 0.25, 14 * GB, min_slope=1 / (2 * GB))
    assert steep == pytest.approx(line_time_s(0.032 * GB, 0.05, 0.128 * GB, 0.25, 14 * GB))
    f = fit_sizes([0.032 * GB, 0.128 * GB], [[0.24, 0.26], [0.25, 0.27]], 14 * GB, min_slope=1 / (2 * GB))
    assert 14 * GB / f.low_s <= 2 * GB * 1.001


def test_a_run_faster_than_the_floor_still_bounds_the_range():
    # the writer's ceiling (the floor's rate) was measured slower than one of the runs at the target:
    # the range reaches that run all the same
    f = fit_sizes([1000 * MiB], [[0.064, 0.070]], 1000 * MiB, min_slope=0.0716 / (1000 * MiB))
    assert f.low_s <= 0.064 and f.high_s >= 0.070


def test_the_allowance_for_another_shape_adds_to_the_runs_spread_in_quadrature():
    import math

    # an end at the point moves the whole factor, either way
    assert widen_end(2.0, 2.0, 1.3, up=True) == pytest.approx(2.6)
    assert widen_end(2.0, 2.0, 1.3, up=False) == pytest.approx(2.0 / 1.3)
    # an end the runs put 40 % out: exp(hypot(ln 1.4, ln 1.3)), less than 1.4 x 1.3 and more than either
    high = widen_end(2.0, 2.8, 1.3, up=True)
    assert high == pytest.approx(2.0 * math.exp(math.hypot(math.log(1.4), math.log(1.3))))
    assert 2.8 < high < 2.8 * 1.3 and high / 2.0 > 1.3
    low = widen_end(2.0, 2.0 / 1.4, 1.3, up=False)
    assert low == pytest.approx(2.0 / math.exp(math.hypot(math.log(1.4), math.log(1.3))))
    # no allowance, or nothing to scale: as given; an end on the other side counts as at the point
    assert widen_end(2.0, 2.8, 1.0, up=True) == 2.8
    assert widen_end(0.0, 0.0, 1.3, up=True) == 0.0
    assert widen_end(2.0, 1.5, 1.3, up=True) == pytest.approx(2.6)


def test_a_falling_line_takes_its_range_from_the_nearer_size_as_its_point():
    # stalls of 2 writers at 0.53 and 1.85 GB (a preflight sample): the larger size's layout stalls less, so
    # the medians' line falls and the point is the larger size's median. Lines through one size's fast run
    # and the other's slow one rose 3.4x out to the node's 5.6 GB and read 0.64 s; the node stalled 0.09 s.
    small, large = [0.121, 0.132, 0.133], [0.075, 0.219, 0.107]
    f = fit_time(0.534e9, small, 1.85e9, large, 5.6e9)
    assert f.point_s == pytest.approx(0.107)
    assert f.high_s == pytest.approx(max(max(large), 0.107 + next_median_half_width(large)))
    assert f.high_s < 0.3 and f.low_s <= 0.075
    # with a floor on the slope, the bytes beyond the larger size move the whole range alike
    g = fit_time(0.534e9, small, 1.85e9, large, 5.6e9, min_slope=1e-11)
    assert g.point_s == pytest.approx(f.point_s + 3.75e9 * 1e-11) and g.high_s == pytest.approx(f.high_s + 0.0375)


def test_spare_time_buys_runs_up_to_the_most():
    def one_warmup_per_two_runs(runs: int) -> int:
        return max(2, runs // 2) if runs > 1 else 1

    # 10 s a run in 60 s: 4 runs and 2 warm-ups fit, 5 runs and 2 warm-ups do not
    assert affordable_runs(60, 10, least=3, most=6, warmups=one_warmup_per_two_runs) == 4
    assert affordable_runs(600, 10, least=3, most=6, warmups=one_warmup_per_two_runs) == 6  # capped
    # the budget that set the size leaves nothing over: the least stands even where it does not fit
    assert affordable_runs(20, 10, least=3, most=6, warmups=one_warmup_per_two_runs) == 3
    for bad in ({"least": 0, "most": 3}, {"least": 4, "most": 3}):
        with pytest.raises(ValueError):
            affordable_runs(60, 10, warmups=one_warmup_per_two_runs, **bad)
    with pytest.raises(ValueError):
        affordable_runs(60, 0, least=1, most=2, warmups=one_warmup_per_two_runs)

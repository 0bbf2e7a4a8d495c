"""From a sample to the node's size: a fixed part plus a per-byte part, fitted over two sizes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptbench.decide.scaling import fit_time, line_time_s

MiB = 2**20


def test_a_fixed_cost_is_not_scaled_with_the_bytes():
    # 0.1 s fixed + 1 GB/s: 0.234 s at 128 MiB, 0.637 s at 512 MiB; the node writes 5 GiB
    small, large, node = 128 * MiB, 512 * MiB, 5 * 1024 * MiB
    t = line_time_s(small, 0.1 + small / 1e9, large, 0.1 + large / 1e9, node)
    assert t == pytest.approx(0.1 + node / 1e9)
    proportional = (0.1 + large / 1e9) * node / large
    assert proportional > 1.1 * t  # one size scaled in proportion overstates it


def test_noise_that_makes_the_line_fall_or_cross_zero():
    assert line_time_s(100, 0.5, 400, 0.4, 4000) == 0.5  # flat: the larger time stands
    assert line_time_s(100, 0.01, 400, 0.4, 4000) == pytest.approx(0.4 * 10)  # fixed < 0: in proportion
    with pytest.raises(ValueError):
        line_time_s(400, 0.4, 100, 0.1, 1000)


def test_the_range_covers_every_line_through_extreme_runs():
    fitted = fit_time(100, [0.10, 0.12, 0.11], 400, [0.40, 0.46, 0.43], 1000)
    assert fitted.low_s <= fitted.point_s <= fitted.high_s
    assert fitted.low_s == pytest.approx(line_time_s(100, 0.12, 400, 0.40, 1000))
    assert fitted.high_s == pytest.approx(line_time_s(100, 0.10, 400, 0.46, 1000))


runs = st.lists(st.floats(min_value=1e-3, max_value=10.0), min_size=1, max_size=5)


@given(runs, runs, st.floats(min_value=1.0, max_value=1e3))
def test_fitted_times_are_positive_and_ordered(small_runs, large_runs, scale):
    f = fit_time(1e6, small_runs, 4e6, large_runs, 4e6 * scale)
    assert 0 < f.low_s <= f.point_s <= f.high_s

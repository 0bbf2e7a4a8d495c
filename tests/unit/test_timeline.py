"""Timelines, latency histograms and the burst/sustained detection, on synthetic data."""

from __future__ import annotations

import random

import pytest

from ckptbench.bench import timeline as tl


def _noisy(values: list[float], cv: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [v * (1 + rng.gauss(0, cv)) for v in values]


@pytest.mark.parametrize("seed", range(5))
def test_a_step_down_is_a_burst_with_its_rates_and_the_bytes_before_it(seed: int):
    values = _noisy([2e9] * 6 + [5e8] * 14, 0.05, seed)
    found = tl.steady_state(values, 1.0)
    assert found.state == "burst"
    assert found.change_s == 6.0
    assert found.burst_bytes == int(sum(values[:6]))
    assert found.burst_bps == pytest.approx(2e9, rel=0.1)
    assert found.sustained_bps == pytest.approx(5e8, rel=0.1)


def test_a_one_interval_burst_at_half_second_intervals_is_found():
    found = tl.steady_state([3e9, 1e9, 1e9, 1e9, 1e9, 1e9], 0.5)
    assert found.state == "burst"
    assert found.burst_bytes == 3e9
    assert found.burst_bps == 6e9
    assert found.sustained_bps == 2e9


@pytest.mark.parametrize("seed", range(10))
def test_a_steady_noisy_rate_is_steady(seed: int):
    found = tl.steady_state(_noisy([1e9] * 20, 0.15, seed), 1.0)
    assert found.state == "steady"
    assert found.burst_bps is None and found.sustained_bps is None and found.burst_bytes is None


def test_a_slow_ramp_is_a_drift_not_a_burst():
    values = [2e9 - i * 5e7 for i in range(20)]  # 2.0 -> 1.05 GB/s, no step
    assert tl.steady_state(values, 1.0).state == "drifting"


def test_a_step_up_is_not_a_burst():
    assert tl.steady_state([5e8] * 5 + [2e9] * 10, 1.0).state != "burst"


def test_too_few_intervals_are_too_short_to_tell():
    found = tl.steady_state([2e9, 2e9, 5e8, 5e8], 1.0)
    assert found.state == "too-short"
    assert found.to_dict() == {"state": "too-short", "burst_gbps": None, "sustained_gbps": None,
                               "burst_bytes": None, "change_s": None}


def test_detect_leaves_out_a_short_last_interval():
    # 6.2 s: the 7th interval lasted 0.2 s; its few bytes are no drop.
    timeline = tl.Timeline(1.0, (1e9,) * 6 + (2e8,), 6.2)
    assert timeline.full_intervals() == [1e9] * 6
    assert tl.detect(timeline).state == "steady"
    assert timeline.rates_bps()[-1] == pytest.approx(1e9)


def test_buckets_tile_the_line_and_match_their_bounds():
    previous_high = 0
    for b in range(200):
        low, high = tl.bucket_bounds_ns(b)
        assert low == previous_high and high > low
        assert tl.bucket_of(low) == b and tl.bucket_of(high - 1) == b
        previous_high = high
    low, high = tl.bucket_bounds_ns(tl.bucket_of(10**9))
    assert (high - low) / low <= 1 / 8


def test_histogram_percentiles_fall_in_the_right_bucket():
    samples = [1_000_000] * 90 + [50_000_000] * 9 + [900_000_000]
    h = tl.LatencyHistogram.from_samples(samples)
    assert h.count == 100
    assert h.percentile_ns(50) == pytest.approx(1e6, rel=1 / 8)
    assert h.percentile_ns(99) == pytest.approx(5e7, rel=1 / 8)
    assert h.percentile_ns(100) == pytest.approx(9e8, rel=1 / 8)
    d = h.to_dict()
    assert sum(n for _, _, n in d["buckets"]) == 100
    assert set(d) >= {"unit", "count", "buckets", "p50_ms", "p90_ms", "p99_ms", "p99_9_ms"}
    assert tl.LatencyHistogram(()).percentile_ns(50) is None


def test_merged_histograms_and_timelines_keep_every_count_and_byte():
    a = tl.LatencyHistogram.from_samples([10, 1000, 1000])
    b = tl.LatencyHistogram.from_samples([1000, 10**6])
    assert tl.merge_histograms([a, b]).count == 5
    t1 = tl.Timeline(1.0, (1, 2, 3), 2.5)
    t2 = tl.Timeline(1.0, (10, 20), 2.0)
    together = tl.merge_timelines([t1, t2])
    assert together.bytes == (11, 22, 3) and together.duration_s == 2.5
    after = tl.merge_timelines([t1, t2], [0.0, 3.0])
    assert after.bytes == (1, 2, 3, 10, 20) and after.duration_s == 5.0
    with pytest.raises(ValueError):
        tl.merge_timelines([t1, tl.Timeline(0.5, (1,), 0.5)])


def test_events_are_counted_in_the_interval_they_completed_in():
    t = tl.Timeline.from_events([(0.1, 5), (0.9, 5), (1.0, 7), (3.5, 1)], 1.0, 3.6)
    assert t.bytes == (10, 7, 0, 1) and t.total_bytes == 18

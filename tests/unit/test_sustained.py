"""Sizing the write past the write-back cache from the dirty-page limits, and what a drop does to a write."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptbench.bench import sustained
from ckptbench.bench.timeline import SteadyState

GiB = 2**30


def _proc(tmp_path: Path, *, dirty_bytes: int = 0, ratio: int = 20, available_kib: int = 8 * 2**20) -> Path:
    vm = tmp_path / "sys" / "vm"
    vm.mkdir(parents=True)
    for name, value in (("dirty_bytes", dirty_bytes), ("dirty_ratio", ratio), ("dirty_background_bytes", 0),
                        ("dirty_background_ratio", 10)):
        (vm / name).write_text(f"{value}\n")
    (tmp_path / "meminfo").write_text(f"MemTotal: 16000000 kB\nMemAvailable: {available_kib} kB\n")
    return tmp_path


def test_the_dirty_limit_is_the_ratio_of_available_memory_or_dirty_bytes(tmp_path: Path):
    limits = sustained.read_dirty_limits(_proc(tmp_path / "a"))
    assert limits.threshold_bytes == 8 * GiB * 20 // 100
    assert sustained.read_dirty_limits(_proc(tmp_path / "b", dirty_bytes=GiB)).threshold_bytes == GiB
    assert sustained.read_dirty_limits(tmp_path / "nothing") is None


def test_buffered_writes_go_twice_past_the_dirty_limit_within_the_bounds(tmp_path: Path):
    limits = sustained.read_dirty_limits(_proc(tmp_path, dirty_bytes=GiB))
    size, why = sustained.probe_bytes(limits, direct=False, sample_bytes=GiB // 4, rate_bps=1e9, free_bytes=None, cap_bytes=8 * GiB)
    assert size == 2 * GiB and "dirty-page limit" in why
    size, why = sustained.probe_bytes(limits, direct=False, sample_bytes=GiB // 4, rate_bps=1e9, free_bytes=None, cap_bytes=GiB)
    assert size == GiB and "cut" in why
    size, _ = sustained.probe_bytes(limits, direct=False, sample_bytes=GiB // 4, rate_bps=1e9, free_bytes=2 * GiB, cap_bytes=8 * GiB)
    assert size == 2 * GiB // 4  # a quarter of the free space (knobs.SUSTAINED_PROBE_FREE_FRACTION)


def test_direct_writes_last_seconds_at_the_sample_rate_and_never_less_than_the_sample(monkeypatch):
    from ckptbench import knobs

    monkeypatch.setattr(knobs, "SUSTAINED_PROBE_DIRECT_S", 10.0)
    size, why = sustained.probe_bytes(None, direct=True, sample_bytes=GiB // 2, rate_bps=2**27, free_bytes=None,
                                      cap_bytes=8 * GiB)
    assert size == 10 * 2**27 and "O_DIRECT" in why  # 10 s at 128 MiB/s
    size, _ = sustained.probe_bytes(None, direct=True, sample_bytes=GiB // 2, rate_bps=1e6, free_bytes=None,
                                    cap_bytes=8 * GiB)
    assert size == GiB  # a slow sample: twice its size
    size, _ = sustained.probe_bytes(None, direct=True, sample_bytes=GiB // 2, rate_bps=1e6, free_bytes=GiB // 8,
                                    cap_bytes=8 * GiB)
    assert size == GiB // 2


def test_the_probe_timeline_has_about_twenty_intervals_of_at_most_a_second():
    assert sustained.interval_for(40 * 10**9, 1e9) == 1.0
    assert sustained.interval_for(4 * 10**9, 1e9) == 0.2
    assert sustained.interval_for(10**6, 1e9) == 0.1


def test_a_write_past_the_burst_is_slower_by_the_bytes_at_the_sustained_rate():
    drop = SteadyState("burst", burst_bps=2e9, sustained_bps=5e8, burst_bytes=1_000_000_000, change_s=0.5)
    # 3 GB at 2 GB/s would take 1.5 s; 1 GB at 2 GB/s then 2 GB at 0.5 GB/s take 4.5 s.
    assert sustained.write_slowdown(drop, 3_000_000_000, 2e9) == pytest.approx(3.0)
    assert sustained.write_slowdown(drop, 500_000_000, 2e9) == 1.0  # fits in the burst
    assert sustained.write_slowdown(SteadyState("steady"), 3_000_000_000, 2e9) == 1.0
    assert sustained.write_slowdown(drop, 3_000_000_000, 4e8) == 1.0  # the writer is already slower than that


def test_the_sustained_write_records_every_byte_and_cleans_up(tmp_path: Path):
    from ckptbench.storage.local_target import LocalDirectory

    target = LocalDirectory.from_string(str(tmp_path))
    out = sustained.run_sustained_write(target, 6 << 20, threads=2, block_size=1 << 20, direct=True, reason="test",
                                        interval_s=0.01)
    assert out.bytes == 6 << 20 and out.timeline.total_bytes == out.bytes
    assert out.to_dict()["steady_state"]["state"] in ("burst", "steady", "drifting", "too-short")
    assert list(tmp_path.iterdir()) == []

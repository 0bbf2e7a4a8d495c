"""The fresh-memory probe: what a restore's new tensors cost to fault in, and the VM that makes it vary."""

from __future__ import annotations

import sys

import pytest

from ckptbench.bench import fresh_memory
from ckptbench.bench.fresh_memory import FreshMemory, measure_fresh_memory
from ckptbench.checkpoint.host_memory import proactive_reclaim, reports_free_memory

MiB = 2**20


def _device(root, name: str, device: str, features: str) -> None:
    d = root / name
    d.mkdir()
    (d / "device").write_text(device + "\n")
    (d / "features").write_text(features + "\n")


def test_a_virtio_balloon_with_free_page_reporting_is_recognised(tmp_path):
    _device(tmp_path, "virtio0", "0x0002", "0000011111" + "0" * 54)  # a block device, bit 5 set: not a balloon
    assert not reports_free_memory(str(tmp_path))
    _device(tmp_path, "virtio1", "0x0005", "0110000000" + "0" * 54)  # a balloon without reporting
    assert not reports_free_memory(str(tmp_path))
    _device(tmp_path, "virtio2", "0x0005", "0110010100" + "0" * 54)  # reporting (bit 5)
    assert reports_free_memory(str(tmp_path))


def test_no_virtio_devices_or_unreadable_ones_are_not_a_reporting_vm(tmp_path):
    assert not reports_free_memory(str(tmp_path / "missing"))
    (tmp_path / "virtio0").mkdir()  # no device file
    _device(tmp_path, "virtio1", "not hex", "0110010100")
    _device(tmp_path, "virtio2", "0x0005", "01100")  # too short to hold bit 5
    assert not reports_free_memory(str(tmp_path))


def _scheme(root, kdamond: str, state: str, action: str, age: str, aggr_us: str = "5000000") -> None:
    context = root / "kdamonds" / kdamond / "contexts" / "0"
    scheme = context / "schemes" / "0"
    (scheme / "access_pattern" / "age").mkdir(parents=True)
    (context / "monitoring_attrs" / "intervals").mkdir(parents=True)
    (root / "kdamonds" / kdamond / "state").write_text(state + "\n")
    (scheme / "action").write_text(action + "\n")
    (scheme / "access_pattern" / "age" / "min").write_text(age + "\n")
    (context / "monitoring_attrs" / "intervals" / "aggr_us").write_text(aggr_us + "\n")


def test_damon_paging_out_idle_memory_is_recognised_with_its_age(tmp_path):
    kdamonds, module = str(tmp_path / "kdamonds"), str(tmp_path / "module")
    assert proactive_reclaim(kdamonds, module) is None  # no DAMON here
    _scheme(tmp_path, "0", "off", "pageout", "12")  # a scheme, but its kdamond is not running
    _scheme(tmp_path, "1", "on", "stat", "12")  # running, but only counting
    assert proactive_reclaim(kdamonds, module) is None
    _scheme(tmp_path, "2", "on", "pageout", "12")  # this VM's: 12 aggregations of 5 s
    assert proactive_reclaim(kdamonds, module) == pytest.approx(60.0)
    (tmp_path / "module").mkdir()
    (tmp_path / "module" / "enabled").write_text("Y\n")
    (tmp_path / "module" / "min_age").write_text("30000000\n")  # damon_reclaim's, in microseconds: the shorter wins
    assert proactive_reclaim(kdamonds, module) == pytest.approx(30.0)
    (tmp_path / "module" / "enabled").write_text("N\n")
    assert proactive_reclaim(kdamonds, module) == pytest.approx(60.0)


def test_bytes_not_reached_are_counted_at_the_tail_chunks_rate():
    probe = FreshMemory(target_bytes=10 * MiB, chunk_bytes=MiB, chunk_seconds=(0.1, 0.1, 1.0, 1.0, 1.0, 1.0),
                        faulted_bytes=6 * MiB, hypervisor_reclaims=False)
    assert probe.seconds == pytest.approx(4.2 + 4 * 1.0)
    assert probe.bps == pytest.approx(10 * MiB / 8.2)
    whole = FreshMemory(4 * MiB, MiB, (0.5, 0.5, 0.5, 0.5), 4 * MiB, True)
    assert whole.seconds == pytest.approx(2.0)
    d = whole.to_dict()
    assert d["slowest_chunk_bps"] == d["fastest_chunk_bps"] == pytest.approx(2 * MiB)
    assert d["hypervisor_reclaims"] is True


@pytest.mark.skipif(sys.platform != "linux", reason="MADV_POPULATE_WRITE is Linux's")
def test_the_probe_faults_the_target_in_chunks(monkeypatch):
    monkeypatch.setattr(fresh_memory, "available_memory_bytes", lambda: 1 << 40)
    probe = measure_fresh_memory(8 * MiB + 1, chunk_bytes=2 * MiB)
    if probe is None:
        pytest.skip("this kernel cannot populate memory on request (before 5.14)")
    assert probe.faulted_bytes == 8 * MiB and len(probe.chunk_seconds) == 4  # the short last chunk left out
    assert probe.target_bytes == 8 * MiB + 1 and probe.seconds > 0


def test_the_probe_stays_within_its_share_of_the_available_memory(monkeypatch):
    monkeypatch.setattr(fresh_memory.knobs, "FRESH_MEMORY_SHARE", 0.5)
    monkeypatch.setattr(fresh_memory, "available_memory_bytes", lambda: 8 * MiB)
    probe = measure_fresh_memory(1 << 40, chunk_bytes=MiB)
    if probe is None:
        pytest.skip("this kernel cannot populate memory on request (before 5.14)")
    assert probe.faulted_bytes == 4 * MiB  # CKPTBENCH_FRESH_MEMORY_SHARE (0.5) of 8 MiB; the rest extrapolated
    assert probe.target_bytes == 1 << 40
    assert measure_fresh_memory(1 << 40, limit_bytes=MiB).chunk_seconds  # a limit below a chunk: one chunk of it
    assert measure_fresh_memory(1 << 40, limit_bytes=MiB).faulted_bytes == MiB
    monkeypatch.setattr(fresh_memory.knobs, "FRESH_MEMORY_SHARE", 0.0)  # the probe turned off
    assert measure_fresh_memory(1 << 30) is None
    monkeypatch.setattr(fresh_memory.knobs, "FRESH_MEMORY_SHARE", 0.5)
    monkeypatch.setattr(fresh_memory, "available_memory_bytes", lambda: None)
    assert measure_fresh_memory(1 << 30) is None

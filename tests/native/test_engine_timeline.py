"""The engine's timeline, latency histogram and deadline: what a call records matches what it did."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ckptbench import native
from ckptbench.bench import timeline as tl


def _source(nbytes: int) -> native.AlignedBuffer:
    buf = native.AlignedBuffer(nbytes)
    native.fill_random(buf, 7)
    return buf


def test_a_write_and_a_read_record_every_byte_in_the_timeline_and_every_op_in_the_histogram(tmp_path: Path):
    buf = _source(4 << 20)
    jobs = [(buf, str(tmp_path / "a"), 0), (buf, str(tmp_path / "b"), 0)]
    for call, kwargs in ((native.write, {}), (native.read, {"drop_cache": True})):
        out = call(jobs, threads=2, block_size=256 << 10, sample_interval_ns=1_000_000, **kwargs)
        assert out.bytes == 8 << 20 and out.ops == 32
        assert out.interval_ns == 1_000_000
        assert int(np.asarray(out.timeline_bytes).sum()) == out.bytes
        histogram = np.asarray(out.latency_histogram)
        assert histogram.size == tl.BUCKETS and int(histogram.sum()) == out.ops
        # The engine's buckets are the ones bench.timeline names: the same samples, the same counts.
        assert tl.LatencyHistogram.from_counts(histogram) == tl.LatencyHistogram.from_samples(out.latencies_ns)
        assert not out.deadline_reached


def test_the_timeline_is_kept_without_latency_samples(tmp_path: Path):
    buf = _source(1 << 20)
    out = native.write([(buf, str(tmp_path / "a"), 0)], block_size=256 << 10, record_latency=False)
    assert len(out.latencies_ns) == 0
    assert int(np.asarray(out.latency_histogram).sum()) == 4
    assert int(np.asarray(out.timeline_bytes).sum()) == 1 << 20


def test_a_deadline_already_past_starts_no_block(tmp_path: Path):
    buf = _source(1 << 20)
    out = native.write([(buf, str(tmp_path / "a"), 0)], block_size=256 << 10, deadline_ns=time.monotonic_ns() - 1)
    assert out.deadline_reached and out.bytes == 0 and out.ops == 0
    assert int(np.asarray(out.timeline_bytes).sum()) == 0


def test_metadata_bench_fills_the_histogram_per_file(tmp_path: Path):
    out = native.metadata_bench(str(tmp_path), 5, 4096)
    assert int(np.asarray(out.latency_histogram).sum()) == 5
    assert int(np.asarray(out.timeline_bytes).sum()) == 5 * 4096

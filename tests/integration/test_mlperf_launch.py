"""``bench --mlperf`` under torchrun (gloo, localhost): every launched rank writes its MLPerf share, MLPerf's
order (every write, one cache drop, every read), the slowest rank's duration per checkpoint, both units."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
from test_distributed import by_hand, torchrun

from ckptbench.bench.mlperf import GIB, WORKLOADS

#: A test/dev subset: every rank's MLPerf bytes x this (about 1.4 MB per rank of llama3-8b).
SCALE = 0.0001


def test_two_launched_ranks_write_their_mlperf_share_then_read_cold(tmp_path: Path):
    target = tmp_path / "target"
    target.mkdir()
    proc = torchrun(["-m", "ckptbench", "bench", str(target), "--mlperf", "llama3-8b", "--scale", str(SCALE),
                     "--num-checkpoints-write", "2", "--num-checkpoints-read", "3", "--output", str(tmp_path / "out")],
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "GB/s (GiB/s) as MLPerf reports it" in proc.stdout and "(1e9 B/s)" in proc.stdout
    assert "subset mode: ranks 0-1 of 8" in proc.stdout
    (result,) = (tmp_path / "out").iterdir()
    doc = json.loads(result.read_text())
    m = doc["mlperf"]
    workload = WORKLOADS["llama3-8b"]
    assert doc["launch"]["world_size"] == 2 and m["mode"] == "subset" and m["ranks_run"] == 2
    assert m["comparable"] is False and m["scale"] == SCALE
    assert m["procedure"]["num_checkpoints_write"] == 2 and m["procedure"]["num_checkpoints_read"] == 3
    for r, nbytes in enumerate(m["rank_bytes"]):  # each rank's MLPerf share, scaled (to whole elements)
        assert nbytes == pytest.approx(workload.rank_bytes(r) * SCALE, abs=16)
    assert m["bytes_per_run"] == sum(m["rank_bytes"])
    # 3 reads of 2 checkpoints: every checkpoint is still there after the writes (read 3 is checkpoint 0)
    assert [len(doc["rounds"][op]) for op in ("save", "load", "async")] == [2, 3, 0]
    for op, name in (("save", "write"), ("load", "read")):
        rounds = doc["rounds"][op]
        for r in rounds:
            assert [s["bytes"] for s in r["ranks"]] == m["rank_bytes"]  # every rank wrote/read its own share
            assert r["duration_s"] == max(s["end_s"] for s in r["ranks"])  # the slowest rank's
        assert m[name]["runs_duration_s"] == [r["duration_s"] for r in rounds]
        assert m[name]["gib_per_s"] == pytest.approx(
            statistics.fmean(m["bytes_per_run"] / r["duration_s"] / GIB for r in rounds))
        assert m[name]["gbps"] == pytest.approx(m[name]["gib_per_s"] * GIB / 1e9)
    assert doc["data_verified"] is True
    assert list(target.iterdir()) == []


def test_ranks_is_refused_under_a_launch(tmp_path: Path):
    """Two ranks started as srun would: each says in one line that --ranks has no place here, exit 2."""
    argv = [sys.executable, "-m", "ckptbench", "bench", str(tmp_path), "--mlperf", "llama3-8b", "--ranks", "2"]
    for proc in by_hand([argv, argv], cwd=tmp_path):
        assert proc.returncode == 2, proc.stderr[-3000:]
        (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
        assert line.startswith("ckptbench: error: --ranks 2: under a launch every launched rank runs (this one has 2)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_launch_of_the_workloads_rank_count_is_mlperfs_default_mode(tmp_path: Path):
    """llama3-8b's 8 ranks started as srun would: every rank writes an eighth of the (scaled) checkpoint."""
    argv = [sys.executable, "-m", "ckptbench", "bench", str(tmp_path), "--mlperf", "llama3-8b", "--scale", "0.00001",
            "--repeat", "1", "--json"]
    procs = by_hand([argv] * 8, cwd=tmp_path, timeout=300)
    assert [p.returncode for p in procs] == [0] * 8, procs[0].stderr[-3000:]
    m = json.loads(procs[0].stdout)["mlperf"]  # rank 0 alone prints
    assert m["mode"] == "default" and m["what_ran"] == "default mode: all 8 ranks" and m["ranks_run"] == 8
    assert sum(m["rank_bytes"]) == pytest.approx(WORKLOADS["llama3-8b"].checkpoint_bytes * 0.00001, abs=8 * 16)
    assert all(p.stdout == "" for p in procs[1:])
    assert list(tmp_path.iterdir()) == []

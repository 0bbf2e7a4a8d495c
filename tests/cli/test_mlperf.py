"""``bench --mlperf``: MLPerf Storage v2.0's checkpointing shapes (bytes per rank from TP x PP x DP and the ZeRO
stage, summing to the published checkpoint), its subset mode on this host, and its numbers in both units."""

from __future__ import annotations

import json

import pytest

from ckptbench.bench.mlperf import GIB, WORKLOADS


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_rank_share_sums_to_the_published_checkpoint(name):
    w = WORKLOADS[name]
    assert sum(w.rank_bytes(r) for r in range(w.ranks)) == pytest.approx(w.checkpoint_bytes, rel=1e-9)
    assert w.tp * w.pp * w.dp == w.ranks


def test_the_published_sizes_are_binary_and_14_bytes_per_parameter():
    assert WORKLOADS["llama3-8b"].params == pytest.approx(8.05e9, rel=0.01)  # Llama 3 8B: 8.03e9 parameters
    assert WORKLOADS["llama3-8b"].subset_bytes(8) == 105 * GIB  # ZeRO-3 on its 8 ranks: all of it


def test_zero1_keeps_the_weights_on_the_first_replica_only():
    w = WORKLOADS["llama3-405b"]  # TP8 x PP32 x DP2: ranks 0-255 are data-parallel replica 0
    first, second = w.rank_bytes(0), w.rank_bytes(256)
    assert second == pytest.approx(w.params * 12 / 512)
    assert first - second == pytest.approx(w.params * 2 / (8 * 32))
    zero3 = WORKLOADS["llama3-70b"]
    assert len({zero3.rank_bytes(r) for r in range(zero3.ranks)}) == 1


def test_a_scaled_subset_runs_and_reports_both_units(cli, tmp_path):
    out = cli("bench", str(tmp_path), "--mlperf", "llama3-8b", "--ranks", "2", "--scale", "0.0001", "--repeat", "1",
              "--format", "json")
    assert out.exit_code == 0, out.stderr
    doc = json.loads(out.stdout)
    m = doc["mlperf"]
    assert doc["schema"] == "ckptbench.bench.distributed/1" and doc["launch"]["world_size"] == 2
    assert m["mode"] == "subset" and m["ranks_run"] == 2 and m["comparable"] is False
    for op, rounds in (("write", doc["rounds"]["save"]), ("read", doc["rounds"]["load"])):
        assert m[op]["runs_duration_s"] == [r["duration_s"] for r in rounds]  # each run: the slowest rank's
        assert m[op]["gib_per_s"] == pytest.approx(m[op]["gbps"] * 1e9 / GIB)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("args", "named"), [
    (["--mlperf", "llama3-8b", "--size", "1GiB"], "--size does not apply to --mlperf"),
    (["--mlperf", "llama3-8b", "--ranks", "9"], "llama3-8b has 8 ranks"),
    (["--mlperf", "llama3-8b", "--ranks", "1"], "--ranks 1"),
    (["--ranks", "4"], "--ranks goes with --mlperf"),
    (["--mlperf", "llama3-2t"], "llama3-2t"),
])
def test_bad_input_is_one_line_exit_2(cli, tmp_path, args, named):
    out = cli("bench", str(tmp_path), *args)
    assert out.exit_code == 2
    (line,) = out.stderr.strip().splitlines()
    assert named in line
    assert list(tmp_path.iterdir()) == []

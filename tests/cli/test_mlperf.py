"""``bench --mlperf``: MLPerf Storage v2.0's checkpointing shapes (bytes per rank from TP x PP x DP and the ZeRO
stage, summing to the published checkpoint), its subset mode on this host, and its numbers in both units."""

from __future__ import annotations

import json

import pytest

from ckptbench.bench.mlperf import GIB, WORKLOADS, rank_workload, run_shape
from ckptbench.errors import UsageError


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


def test_a_launch_larger_than_the_workload_is_refused_and_a_smaller_one_is_a_subset():
    w = WORKLOADS["llama3-8b"]
    with pytest.raises(UsageError, match="llama3-8b has 8 ranks; this launch has 9"):
        run_shape(w, 9)
    assert run_shape(w, 8)[0] == "default"
    mode, what = run_shape(w, 2)
    assert mode == "subset" and "ranks 0-1 of 8, 25.0% of the checkpoint" in what


def test_a_rank_state_dict_holds_its_share_as_weights_and_optimizer_state():
    w = WORKLOADS["llama3-405b"]
    part = rank_workload(w, 0, scale=1e-4)
    assert part.total_bytes == pytest.approx(w.rank_bytes(0) * 1e-4, abs=16)
    weights, optimizer = w.rank_parts(0)
    assert part.bytes_by_dtype()["bf16"] == pytest.approx(weights * 1e-4, abs=2)
    assert part.bytes_by_dtype()["fp32"] == pytest.approx(optimizer * 1e-4, abs=12)
    assert not [t for t in rank_workload(w, 256, 1e-4).tensors if t.dtype == "bf16"]  # replica 1: no weights


def test_a_scaled_subset_runs_and_reports_both_units(cli, tmp_path):
    out = cli("bench", str(tmp_path), "--mlperf", "llama3-8b", "--ranks", "2", "--scale", "0.0001", "--repeat", "1",
              "--format", "json")
    assert out.exit_code == 0, out.stderr
    doc = json.loads(out.stdout)
    m = doc["mlperf"]
    assert doc["schema"] == "ckptbench.bench.distributed/1" and doc["launch"]["world_size"] == 2
    assert m["mode"] == "subset" and m["ranks_run"] == 2 and m["comparable"] is False
    assert m["procedure"]["num_checkpoints_write"] == m["procedure"]["num_checkpoints_read"] == 1  # --repeat 1
    for op, rounds in (("write", doc["rounds"]["save"]), ("read", doc["rounds"]["load"])):
        assert m[op]["runs_duration_s"] == [r["duration_s"] for r in rounds]  # each run: the slowest rank's
        assert m[op]["gib_per_s"] == pytest.approx(m[op]["gbps"] * 1e9 / GIB)
    assert list(tmp_path.iterdir()) == []
    result = tmp_path / "mlperf.json"
    result.write_text(out.stdout)
    report = cli("report", str(result), "--markdown", str(tmp_path / "r.md"))
    assert report.exit_code == 0, report.stderr
    text = (tmp_path / "r.md").read_text()
    assert "llama3-8b: subset mode: ranks 0-1 of 8" in text
    assert f"MLPerf write: {m['write']['gib_per_s']:.2f} GB/s (GiB/s) = {m['write']['gbps']:.2f} GB/s (1e9 B/s)" in text


@pytest.mark.parametrize(("args", "named"), [
    (["--mlperf", "llama3-8b", "--size", "1GiB"], "--size does not apply to --mlperf"),
    (["--mlperf", "llama3-8b", "--ranks", "9"], "llama3-8b has 8 ranks"),
    (["--mlperf", "llama3-8b", "--ranks", "1"], "--ranks 1"),
    (["--ranks", "4"], "--ranks goes with --mlperf"),
    (["--mlperf", "llama3-2t"], "llama3-2t"),
    (["--mlperf", "llama3-8b", "--num-checkpoints-read", "0"], "--num-checkpoints-read"),
    (["--num-checkpoints-write", "2"], "--num-checkpoints-write goes with --mlperf"),
    (["--mlperf", "llama3-8b", "--scale", "1e-12"], "leaves a rank nothing to write"),
    (["--mlperf", "llama3-8b", "--threads", "4"], "--threads does not apply to --mlperf"),
])
def test_bad_input_is_one_line_exit_2(cli, tmp_path, args, named):
    out = cli("bench", str(tmp_path), *args)
    assert out.exit_code == 2
    (line,) = out.stderr.strip().splitlines()
    assert named in line
    assert list(tmp_path.iterdir()) == []

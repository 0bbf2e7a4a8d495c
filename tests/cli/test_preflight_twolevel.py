"""``ckptbench preflight --local DIR --remote DIR|URL``: compare's two-level measurement judged with preflight's
job model (sizing, ranges, PASS/WARN/FAIL/BORDERLINE exit codes), bad input (one line, exit 2, nothing written),
and the pure checks. Small I/O, never asserts timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_compare_twolevel import _drain, _tier

from ckptbench.decide.twolevel_verdict import TierFacts, evaluate_two_levels, node_job
from ckptbench.decide.verdict import EXIT_CODES, Job
from ckptbench.model import sizing
from ckptbench.model.failures import FailureModel

QUICK = ["--measure-size", "8MiB", "--repeat", "2", "--measure-time", "0"]
CHECKS = {"checkpoint-time", "overhead", "drain-keeps-up", "restore-local", "restore-remote", "free-space",
          "remote-free-space"}


def test_both_tiers_and_the_drain_measured_and_judged(cli, two_dirs, tmp_path: Path):
    local, remote = two_dirs
    png = tmp_path / "two.png"
    result = cli("preflight", "--local", str(local), "--remote", str(remote), *QUICK, "--params", "100M",
                 "--ranks", "1", "--mtbf", "1d", "--local-loss", "30%", "--plot", str(png), "--json")
    doc = json.loads(result.stdout)
    assert doc["schema"] == "ckptbench.preflight.two-level/1"
    assert result.exit_code == EXIT_CODES[doc["verdict"]], result.stderr
    checks = {c["name"]: c for c in doc["checks"]}
    assert set(checks) >= CHECKS
    statuses = {c["status"] for c in doc["checks"]}
    assert doc["verdict"] == next((s for s in ("FAIL", "BORDERLINE", "WARN") if s in statuses), "PASS")
    p = doc["predictions"]
    for key in ("local_stall_s", "drain_s", "local_restore_s", "remote_restore_s", "overhead_fraction"):
        low, high = p[f"{key}_range"]
        assert low <= p[key] <= high, key
    # the drain check reads the drain against the time between two drains: k local intervals
    drain = checks["drain-keeps-up"]
    assert drain["value"] == p["drain_s"] and drain["threshold"] == p["drain_window_s"] >= p["interval_s"]
    two = doc["two_level"]
    assert two["local_loss"] == 0.3 and len(two["drain"]["runs_drain_s"]) == 2
    assert [t["label"] for t in doc["tiers"]] == [str(local), str(remote)]
    # one rank on one node of 100M params: the node's bytes are the job's, measured by one process
    assert doc["job"]["checkpoint_per_node_bytes"] == doc["job"]["checkpoint"]["total_bytes"]
    assert two["drain_s"] == pytest.approx(p["drain_s"])
    settings = {a["setting"]: a["value"] for a in doc["recommendation"]}
    assert settings["schedule"] == two["recommendation"]
    assert (doc["manager"] is not None) == (two["recommendation"] == "two-level")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in local.iterdir()) == ["keep.bin"] and list(remote.iterdir()) == []


def test_the_console_shows_the_checks_and_the_verdict(cli, two_dirs):
    local, remote = two_dirs
    result = cli("preflight", "--local", str(local), "--remote", str(remote), *QUICK, "--params", "100M",
                 "--ranks", "1", "--mtbf", "1d", "--local-loss", "30%", "--remote-every", "3", "--interval", "1h")
    assert result.exit_code in (0, 1, 3), result.stderr
    text = " ".join(result.stdout.split())
    assert f"two levels: {local} drained to {remote}" in text
    assert "drain-keeps-up" in text and "restore-remote" in text and "verdict:" in text
    assert "every 3 local checkpoint(s)" in text


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--local", "{a}", "--remote", "{b}", "--remote-every", "0"], "--remote-every"),
        (["--local", "{a}", "--remote", "{b}", "--local-loss", "150%"], "--local-loss"),
        (["--local", "{a}", "--remote", "{a}"], "is the --local tier"),
        (["--local", "{b}", "--remote", "{a}/.."], "is the --local tier"),
        (["--local", "{a}"], "--local needs --remote URL"),
        (["--remote", "{b}"], "--remote needs --local DIR"),
        (["{a}", "--local", "{a}", "--remote", "{b}"], "both say where to checkpoint"),
        (["{a}", "--remote-every", "2"], "--remote-every applies to two levels"),
        (["--local", "{a}", "--remote", "{b}", "--endpoint-url", "http://127.0.0.1:9"], "apply to object storage"),
        (["--local", "{a}", "--remote", "s3://bucket/x", "--endpoint-url", "http://127.0.0.1:9",
          "--storage-option", "key=k", "--storage-option", "secret=s"], "127.0.0.1:9"),
    ],
)
def test_bad_input_is_one_line_exit_2_before_anything_is_measured(cli, two_dirs, args, needle):
    a, b = two_dirs
    result = cli("preflight", *[arg.format(a=a, b=b) for arg in args], *QUICK)
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptbench: error:"), result.stderr
    assert needle in lines[0]
    assert sorted(p.name for p in a.iterdir()) == ["keep.bin"] and list(b.iterdir()) == []


# -- the pure checks ---------------------------------------------------------------------------------------


def _preflight_job(interval_s: float | None = None, ranks: int = 8) -> Job:
    size = sizing.checkpoint_size(7e9, sizing.TrainingRecipe(), sizing.Parallelism(dp=ranks, sharding="fsdp"))
    return Job(size=size, model_name="test", ranks=ranks, ranks_per_node=8,
               failures=FailureModel(mtbf_s=6 * 3600.0, source="test"), restart_s=300.0, interval_s=interval_s,
               max_ckpt_time_s=60.0)


FACTS = TierFacts(local_free_bytes=10**13, remote_free_bytes=None, host_memory_bytes=2**40)


def _verdict(job: Job, drain_gbps: float, *, spread: float = 0.0, remote_every: int | None = None):
    spec = node_job(job)
    local, remote = _tier("nvme", 5.0, 5.0, spec), _tier("s3", 1.0, 1.0, spec)
    return evaluate_two_levels(job, local, remote, _drain(drain_gbps, spread=spread), FACTS, local_loss=0.3,
                               local_loss_source="test", remote_every=remote_every, sampled_bytes=10**9)


def _status(verdict, name: str) -> str:
    return next(c.status for c in verdict.checks if c.name == name)


def test_a_drain_slower_than_the_time_between_drains_fails():
    job = _preflight_job(interval_s=600.0)
    node = job.node_bytes
    fast = _verdict(job, drain_gbps=node / 60 / 1e9, remote_every=1)  # a drain of a minute every 10 minutes
    assert _status(fast, "drain-keeps-up") == "PASS"
    slow = _verdict(job, drain_gbps=node / 3600 / 1e9, remote_every=2)  # an hour every 20 minutes
    assert _status(slow, "drain-keeps-up") == "FAIL"
    assert slow.verdict == "FAIL" and slow.exit_code == 1
    drain = next(c for c in slow.checks if c.name == "drain-keeps-up")
    assert drain.value > drain.threshold and "--remote-every" in drain.remedy
    # draining every 8th local checkpoint gives it 80 minutes: it keeps up
    assert _status(_verdict(job, drain_gbps=node / 3600 / 1e9, remote_every=8), "drain-keeps-up") == "PASS"


def test_a_range_that_spans_the_threshold_is_borderline():
    job = _preflight_job(interval_s=600.0)
    # the median drain takes 20 minutes against a 20-minute window; its runs spread either way
    verdict = _verdict(job, drain_gbps=job.node_bytes / 1190 / 1e9, spread=0.5, remote_every=2)
    drain = next(c for c in verdict.checks if c.name == "drain-keeps-up")
    assert drain.status == "BORDERLINE" and drain.value_range[0] < drain.threshold < drain.value_range[1]
    assert "settle it" in drain.remedy
    assert verdict.verdict in ("BORDERLINE", "FAIL") and verdict.exit_code in (1, 3)


def test_the_node_bytes_set_the_times_and_the_optimum_is_checked_without_an_interval():
    two_nodes, one_node = _preflight_job(ranks=16), _preflight_job(ranks=8)  # FSDP: twice the nodes, half each
    assert one_node.node_bytes > two_nodes.node_bytes
    small, large = _verdict(two_nodes, drain_gbps=1.0), _verdict(one_node, drain_gbps=1.0)
    assert large.predictions["drain_s"] == pytest.approx(small.predictions["drain_s"] * one_node.node_bytes
                                                         / two_nodes.node_bytes)
    assert large.predictions["interval_is_optimal"]
    assert large.predictions["interval_s"] == large.decision["two_level"]["recommended_interval_s"]
    assert large.predictions["remote_every"] == large.decision["two_level"]["levels"][1]["every"]

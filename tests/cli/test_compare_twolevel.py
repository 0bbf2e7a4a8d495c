"""``ckptbench compare --local DIR --remote DIR|URL``: both tiers and the drain measured with the real writer,
single level or two levels recommended with ranges, bad input (one line, exit 2, nothing written), and the
pure decision. Small I/O, never asserts timings. On S3 (Ceph RGW): tests/storage/test_manager_s3.py."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import pytest
from compare_helpers import assert_refused_before_measuring

from ckptbench.bench.drain_measure import DrainBench
from ckptbench.bench.tier_comparison import JobSpec, Measured, TierResult, model_tier
from ckptbench.decide.twolevel_choice import decide
from ckptbench.model import sizing
from ckptbench.model.failures import FailureModel
from ckptbench.model.tiers import TierPrices

QUICK = ["--size", "8MiB", "--repeat", "2", "--warmup", "0"]
# A job small enough that the slowest run of a tiny sample on a busy host still checkpoints well within the MTBF
# (a 105 GB llama3-8b rank measured at a few MB/s would not: compare then refuses the job, rightly).
SMALL_JOB = ["--params", "500M"]


def test_both_tiers_the_drain_and_a_recommendation(cli, two_dirs, tmp_path: Path):
    local, remote = two_dirs
    png = tmp_path / "tiers.png"
    doc = cli.json("compare", "--local", str(local), "--remote", str(remote), *QUICK, *SMALL_JOB, "--mtbf", "6h",
                   "--restart", "5m", "--local-loss", "30%", "--plot", str(png))
    assert [t["label"] for t in doc["tiers"]] == [str(local), str(remote)]
    two = doc["two_level"]
    drain = two["drain"]
    assert len(drain["runs_drain_s"]) == 2 and len(drain["runs_direct_save_s"]) == 2
    assert len(drain["runs_stall_alone_s"]) == 2 and len(drain["runs_stall_during_s"]) == 2
    assert drain["drain_gbps"] == pytest.approx(drain["workload_bytes"] / statistics.median(drain["runs_drain_s"]) / 1e9)
    assert drain["drain_vs_direct"] == pytest.approx(statistics.median(
        [direct / drained for drained, direct in zip(drain["runs_drain_s"], drain["runs_direct_save_s"], strict=True)]))
    job = doc["job"]
    assert two["drain_s"] == pytest.approx(job["rank_bytes"] / (drain["drain_gbps"] * 1e9))
    assert two["local_loss"] == 0.3 and two["local_loss_source"] == "given (--local-loss)"
    local_model, remote_model = (t["model"] for t in doc["tiers"])
    assert two["local_restart_s"] == pytest.approx(300 + local_model["restore_s"])
    assert two["remote_restart_s"] == pytest.approx(300 + remote_model["restore_s"])
    best = two["two_level"]
    low, high = best["waste_fraction_range"]
    assert low <= best["waste_fraction"] <= high
    one = two["single_level"]
    assert one["waste_fraction"] == remote_model["waste_fraction"]
    assert one["waste_fraction_range"][0] <= one["waste_fraction"] <= one["waste_fraction_range"][1]
    assert one["interval_s_range"][0] <= one["interval_s"] <= one["interval_s_range"][1]
    assert two["recommendation"] in ("single-level", "two-level")
    if two["recommendation"] == "two-level":
        assert not two["tied"] and best["waste_fraction"] < one["waste_fraction"]
    assert png.exists() and (tmp_path / "tiers-two-level.png").read_bytes()[:4] == b"\x89PNG"
    # the scratch directories are gone, what was there stays
    assert sorted(p.name for p in local.iterdir()) == ["keep.bin"] and list(remote.iterdir()) == []


def test_the_table_says_what_to_run(cli, two_dirs):
    local, remote = two_dirs
    result = cli("compare", "--local", str(local), "--remote", str(remote), *QUICK, *SMALL_JOB, "--failures",
                 "llama3", "--gpus", "16384")
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())  # the table wraps cells to the terminal's width
    assert f"drain {local} -> {remote}:" in text and "x a save straight to the remote tier" in text
    assert "single level" in text and "two levels" in text
    assert ("Single level: checkpoint to" in text) != ("Two levels: checkpoint to" in text)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--local", "{a}", "--remote", "{b}", "--remote-every", "0"], "--remote-every"),
        (["--local", "{a}", "--remote", "{b}", "--local-loss", "150%", "--mtbf", "6h"], "--local-loss"),
        (["--local", "{a}", "--remote", "{a}", "--local-loss", "30%", "--mtbf", "6h"], "is the --local tier"),
        (["--local", "{a}", "--remote", "{a}/inside", "--local-loss", "30%", "--mtbf", "6h"], "does not exist"),
        (["--local", "{a}", "--remote", "{b}", "--local-loss", "30%"], "need a failure rate"),
        (["--local", "{a}", "--remote", "{b}", "--mtbf", "6h"], "need --local-loss"),
        (["--local", "{a}", "--mtbf", "6h"], "--local needs --remote URL"),
        (["{a}", "--remote", "{b}"], "--remote needs --local DIR"),
        (["{a}", "--local", "{a}", "--remote", "{b}"], "compare exactly those two tiers"),
        (["{a}", "{b}", "--local-loss", "30%"], "--local-loss applies to two levels"),
        (["--local", "{a}", "--remote", "{b}", "--local-loss", "30%", "--mtbf", "6h", "--remote-every", "2"],
         "--remote-every applies with --every"),
        (["--local", "{a}", "--remote", "s3://bucket/x", "--endpoint-url", "http://127.0.0.1:9",
          "--storage-option", "key=k", "--storage-option", "secret=s", "--local-loss", "30%", "--mtbf", "6h"],
         "127.0.0.1:9"),
    ],
)
def test_bad_input_is_one_line_exit_2_before_anything_is_measured(cli, two_dirs, args, needle):
    assert_refused_before_measuring(cli, two_dirs, args, needle)


def _tier(label: str, save_gbps: float, load_gbps: float, job: JobSpec, spread: float = 0.0) -> TierResult:
    def measured(scale: float) -> Measured:
        return Measured(workload_bytes=10**9, save_gbps=save_gbps * scale, load_gbps=load_gbps * scale,
                        stall_s=0.5, persist_s=1 / (save_gbps * scale), interference=None, save_cached=False,
                        load_cached=False, files=2, disk_bytes=10**9)

    point, best, worst = measured(1.0), measured(1 + spread), measured(1 - spread)
    from ckptbench.bench.tier_comparison import CompareTarget

    models = tuple(model_tier(job, m, TierPrices(), part_bytes=None) for m in (point, best, worst))
    return TierResult(CompareTarget(label, label, storage=None), report=None, measured=point, model=models[0],
                      model_ends=models[1:])


def _job(local_restart_s: float = 300.0) -> JobSpec:
    size = sizing.checkpoint_size(70e9, sizing.TrainingRecipe(), sizing.Parallelism(dp=64, sharding="fsdp"))
    return JobSpec(size=size, model=None, failures=FailureModel(mtbf_s=3 * 3600.0, source="test"),
                   restart_s=local_restart_s, interference=0.02)


def _drain(gbps: float, spread: float = 0.0, stall_ratio: float = 1.0) -> DrainBench:
    runs = tuple(10**9 / (gbps * (1 + d)) / 1e9 for d in (-spread, 0.0, spread))
    return DrainBench(10**9, runs, runs, (0.1, 0.1, 0.1), (0.1 * stall_ratio,) * 3, (1.0,) * 3, (1.0,) * 3)


def test_a_slow_remote_tier_and_frequent_node_loss_choose_by_the_tie_rule():
    job = _job()
    local, slow_remote = _tier("nvme", 5.0, 5.0, job), _tier("s3", 0.2, 0.2, job)
    two = decide(job, local, slow_remote, _drain(0.2), local_loss=0.3, local_loss_source="test")
    assert two["recommendation"] == "two-level" and not two["tied"]
    assert two["two_level"]["waste_fraction"] < two["single_level"]["waste_fraction"]
    local_level, remote_level = two["two_level"]["levels"]
    assert remote_level["every"] >= 1
    assert remote_level["interval_s"] == pytest.approx(remote_level["every"] * local_level["interval_s"])
    # every failure loses the local copy: the local tier cannot pay for itself
    every_loss = decide(job, local, slow_remote, _drain(0.2), local_loss=1.0, local_loss_source="test")
    assert every_loss["recommendation"] == "single-level"


def test_overlapping_ranges_are_a_tie_and_the_single_level_is_recommended():
    job = _job()
    local, remote = _tier("nvme", 2.0, 2.0, job, spread=0.5), _tier("fast", 1.8, 1.8, job, spread=0.5)
    two = decide(job, local, remote, _drain(1.8, spread=0.5), local_loss=0.5, local_loss_source="test")
    assert two["tied"] and two["recommendation"] == "single-level"
    assert "tied" in two["reason"]


def test_the_pessimistic_end_counts_the_stall_measured_during_a_drain():
    job = _job()
    local, remote = _tier("nvme", 5.0, 5.0, job), _tier("s3", 0.2, 0.2, job)
    calm = decide(job, local, remote, _drain(0.2, stall_ratio=1.0), local_loss=0.3, local_loss_source="test")
    busy = decide(job, local, remote, _drain(0.2, stall_ratio=3.0), local_loss=0.3, local_loss_source="test")
    assert busy["stall_scale_pessimistic"] == pytest.approx(3.0)
    assert busy["two_level"]["waste_fraction"] == calm["two_level"]["waste_fraction"]
    assert busy["two_level"]["waste_fraction_range"][1] > calm["two_level"]["waste_fraction_range"][1]


def test_the_stall_ratio_is_printed_as_what_it_is_a_median_of_the_rounds_ratios():
    """The medians of the stalls alone and during a drain need not divide into the median of the rounds'
    ratios (each pair measured together): the line says which it is, with the rounds' spread."""
    from ckptbench.cli.compare import _per_round

    assert _per_round([1.7, 0.93, 1.26]) == "1.26x, the median of 3 rounds' 0.93–1.70x"
    assert _per_round([1.1]) == "1.10x" and _per_round([]) == "-"


@pytest.mark.parametrize(("endpoint", "here"), [
    ("http://127.0.0.1:9", True), ("http://localhost:9", True), ("http://[::1]:9", True),
    ("http://192.0.2.1:9", False),  # TEST-NET-1: never an address of a host
    (None, None),  # AWS's endpoint: resolved where DNS answers (False), None where it does not (these tests)
])
def test_the_drain_says_when_the_remote_tiers_server_runs_on_this_host(endpoint, here, monkeypatch):
    """An S3 server on this host works on the drain's requests with the CPUs the local saves stage on: the
    drain's record says so, and the printed drain line with it. Another host's server, or an unknown one: no."""
    import socket

    from ckptbench.bench.drain_measure import server_here_note
    from ckptbench.storage.object_target import ObjectTarget

    if endpoint and "::1" in endpoint and not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    if endpoint is None:  # no DNS in these tests, so the default endpoint resolves to nothing
        monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: (_ for _ in ()).throw(socket.gaierror("none")))
    target = ObjectTarget("s3://bucket/prefix", {"endpoint_url": endpoint} if endpoint else {})
    found = target.server_on_this_host()
    assert found is here
    doc = dataclasses.replace(_drain(1.0, stall_ratio=1.4), remote_server_here=found).to_dict()
    assert doc["remote_server_here"] is here
    note = server_here_note(doc)
    assert (note is not None) == bool(here)
    if here:
        assert "this host" in note and "stall during a drain" in note


def test_an_address_of_this_hosts_own_interfaces_counts_as_this_host():
    """Not only loopback: an endpoint at one of this host's interface addresses is this host too."""
    import socket

    from ckptbench.storage.object_target import _is_local_address

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: picks the interface a route would use
            own = probe.getsockname()[0]
        except OSError:
            pytest.skip("no IPv4 route here")
    assert _is_local_address(socket.AF_INET, own)
    assert not _is_local_address(socket.AF_INET, "192.0.2.1")


def test_the_takeaway_shows_the_waste_and_its_range_as_the_table_does():
    """A range that rounds to one value at 0.1 % is shown to 0.01 %, as the table above it, not "2.9 %–2.9 %";
    one that rounds to one value there too is not shown."""
    from ckptbench.cli.compare import two_level_takeaway

    levels = [{"name": "local", "interval_s": 3600.0, "every": None}, {"name": "remote", "interval_s": 3600.0,
                                                                      "every": 1}]
    two = {"local": "/nvme", "remote": "s3://b/x", "reason": "tied", "recommendation": "single-level",
           "single_level": {"interval_s": 3780.0, "waste_fraction": 0.0291, "waste_fraction_range": [0.0287, 0.0294]},
           "two_level": {"levels": levels, "recommended_interval_s": 3600.0, "waste_fraction": 0.0275,
                         "waste_fraction_range": [0.02751, 0.02753]}}
    assert "about 2.91 % (2.87 %–2.94 %) of wall time lost" in two_level_takeaway(two)
    two["recommendation"] = "two-level"
    assert "about 2.75 % of wall time lost;" in two_level_takeaway(two)

"""``ckptbench compare`` on local directories: the JSON document and how its model numbers follow from
the measurements, the table, tier files and their bill, bad input (one line, exit 2, nothing written),
and the pure parts (tier files, request counts, the bill, the per-tier model). Small I/O,
never asserts timings."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from compare_helpers import assert_refused_before_measuring

from ckptbench.bench.tier_comparison import JobSpec, Measured, TierModel, model_tier
from ckptbench.errors import ConfigError, UsageError
from ckptbench.model import interval, sizing
from ckptbench.model.failures import FailureModel
from ckptbench.model.interference import ASSUMED
from ckptbench.model.presets import configs_dir
from ckptbench.model.tiers import (
    SECONDS_PER_MONTH,
    RunUse,
    TierPrices,
    load_tier,
    object_requests,
    run_bill,
    tier_from_mapping,
    tier_names,
)

QUICK = ["--size", "8MiB", "--repeat", "1", "--warmup", "0"]
MiB = 2**20


def test_json_numbers_follow_from_the_measurements(cli, two_dirs, tmp_path: Path):
    a, b = two_dirs
    out, png = tmp_path / "results", tmp_path / "tiers.png"
    doc = cli.json("compare", str(a), str(b), *QUICK, "--mtbf", "3h", "--restart", "10m", "--ranks", "8",
                   "--output", str(out), "--plot", str(png))
    assert doc["schema"] == "ckptbench.compare/1"
    assert doc["spec"]["workload"] == "checkpoint" and doc["spec"]["writers"] == ["ckptbench"]
    assert [t["label"] for t in doc["tiers"]] == [str(a), str(b)]
    job = doc["job"]
    params = 8_030_261_248  # llama3-8b, the default model
    assert job["checkpoint_bytes"] == params * 14 and job["ranks"] == 8
    assert job["rank_bytes"] == pytest.approx(job["checkpoint_bytes"] / 8, abs=1)
    assert job["mtbf_s"] == 3 * 3600 and job["restart_s"] == 600 and job["mode"] == "async"
    for t in doc["tiers"]:
        assert t["kind"] == "directory" and t["tier"] is None and t["filesystem"]
        bench, m, model = t["bench"], t["measured"], t["model"]
        assert bench["schema"] == "ckptbench.bench.checkpoint/1" and bench["data_verified"] is True
        assert m["save_gbps"] == bench["results"][0]["save"]["gbps"] > 0
        assert m["load_gbps"] == bench["results"][0]["load"]["gbps"] > 0
        assert m["stall_s"] == bench["async"][0]["stall_s"] and m["persist_s"] == bench["async"][0]["persist_s"]
        rank = job["rank_bytes"]
        assert model["checkpoint_s"] == pytest.approx(rank / (m["save_gbps"] * 1e9))
        assert model["restore_s"] == pytest.approx(rank / (m["load_gbps"] * 1e9))
        assert model["restart_s"] == pytest.approx(600 + model["restore_s"])
        assert model["stall_s"] == pytest.approx(m["stall_s"] * rank / m["workload_bytes"])
        assert model["persist_s"] == pytest.approx(m["persist_s"] * rank / m["workload_bytes"])
        # no --interference: the stated assumption, the same as every command's
        assert job["interference"] == ASSUMED.point
        analysis = interval.analyse(interval.CheckpointCost(model["stall_s"], model["persist_s"], ASSUMED.point),
                                    3 * 3600, model["restart_s"])
        assert model["optimal_interval_s"] == pytest.approx(analysis.optimal_interval_s)
        assert model["waste_fraction"] == pytest.approx(analysis.waste_fraction)
        assert model["waste_fraction"] > model["overhead_fraction"] > 0
        assert model["bill"] is None and model["error"] is None
    # every metric has a winner beyond the noise or a tie (both directories share one disk here)
    assert set(doc["best"]) | set(doc["tied"]) >= {"save_gbps", "load_gbps", "checkpoint_s", "waste_fraction"}
    assert not set(doc["best"]) & set(doc["tied"])
    assert set(doc["best"].values()) <= {str(a), str(b)}
    assert all(sorted(labels) == sorted([str(a), str(b)]) for labels in doc["tied"].values())
    for t in doc["tiers"]:
        assert t["bottleneck"]["limit"] in ("writer", "storage", "unknown")
        low, high = t["model_range"]["checkpoint_s"]
        assert low <= t["model"]["checkpoint_s"] <= high
    assert doc["units"]["_s"] == "seconds" and doc["assumptions"]
    assert any("8 ranks" in note for note in doc["notes"])
    assert all(w["remedy"] for w in doc["warnings"])
    assert "same-filesystem" in {w["code"] for w in doc["warnings"]}  # both are under tmp_path
    assert doc["environment"]["host"] and doc["argv"][0] == "ckptbench"  # (sys.argv: pytest's here)
    (saved,) = out.glob("compare-*.json")
    assert json.loads(saved.read_text())["tiers"][0]["label"] == str(a)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in a.iterdir()) == ["keep.bin"] and list(b.iterdir()) == []


def test_table_with_a_tier_file_its_bill_and_sync_mode(cli, two_dirs, tmp_path: Path):
    a, b = two_dirs
    tier = tmp_path / "cheap-disk.toml"
    tier.write_text(f'url = "{b}"\ncost_per_gb_month_usd = 0.1\nnotes = "a test tier"\n')
    result = cli("compare", str(a), str(tier), *QUICK, "--mode", "sync", "--every", "1h", "--params", "1B",
                 "--run-time", "10d", "--keep", "3")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for needle in ("cheap-disk", str(a), "save GB/s (durable)", "load GB/s (cold)", "checkpoint time (sync)",
                   "restore", "overhead every 1h", "$ per run (10d, keep 3)", "no prices",
                   "tier cheap-disk", "a test tier", "no failure rate", "Fastest checkpoint:"):
        assert needle in out, needle
    assert "async stall" not in out and "optimal interval, job" not in out

    doc = cli.json("compare", str(a), "--tier", str(tier), *QUICK, "--mode", "sync", "--every", "1h",
                   "--params", "1B", "--run-time", "10d", "--keep", "3")
    slow = doc["tiers"][1]
    assert slow["label"] == "cheap-disk" and slow["tier"]["cost_per_gb_month_usd"] == 0.1
    bill, model = slow["model"]["bill"], slow["model"]
    assert model["overhead_fraction_at_interval"] == pytest.approx(model["checkpoint_s"] / 3600)
    wall_s = 10 * 86400 * (1 + model["checkpoint_s"] / 3600)  # no failure rate: stalls only
    assert bill["storage_usd"] == pytest.approx(3 * 14e9 / 1e9 * wall_s / SECONDS_PER_MONTH * 0.1)
    assert bill["put_usd"] is None and bill["total_usd"] == bill["storage_usd"]
    assert doc["tiers"][0]["model"]["bill"] is None
    assert "bill_total_usd" not in doc["best"] and "bill_total_usd" not in doc["tied"]  # one tier has prices


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "give the tiers to compare"),
        (["{a}", "nope"], "'nope' is neither an existing directory, a URL, nor a tier (known tiers: cephfs, "
                          "local-nvme, s3-standard"),
        (["{a}", "--tier", "nope"], "unknown tier 'nope' (known: cephfs, local-nvme, s3-standard"),
        (["{a}", "{b}", "{a}/missing"], "does not exist"),
        (["{a}", "{b}", "{a}"], "is given twice"),
        (["{a}", "local-nvme"], "tier local-nvme ("),
        (["{a}", "--scale", "0.01", "--size", "1GiB"], "not both"),
        (["{a}", "--model", "gpt-17"], "unknown model preset 'gpt-17' (known: "),
        (["{a}", "--failures", "nope"], "unknown failure preset 'nope' (known: llama3, mlcommons, one-per-day)"),
        (["{a}", "--failures", "mlcommons"], "--gpus"),
        (["{a}", "--mtbf", "3h", "--faults-per-day", "2"], "both give the failure rate"),
        (["{a}", "--gpus", "8", "--mtbf", "3h"], "--gpus 8 is used only with"),
        (["{a}", "--mode", "sync", "--interference", "5%"], "--interference describes asynchronous"),
        (["{a}", "--interference", "1"], "[0, 1)"),
        (["{a}", "--storage-option", "part_size=8MiB"], "apply to object storage"),
        (["{a}", "--storage-option", "secret"], "KEY=VALUE"),
        (["{a}", "--workload", "fs"], "'fs' is not"),
        (["{a}", "--plot", "{a}/no/such/dir/x.png"], "does not exist"),
        (["{a}", "--size", "1PiB"], "more than the full llama3-8b workload"),
        (["{a}", "--ranks", "0"], "positive whole number"),
        (["{a}", "--device", "tpu"], "device 'tpu' must be cpu, cuda or cuda:N"),
    ],
)
def test_bad_input_is_one_line_exit_2_before_anything_is_written(cli, two_dirs, args, needle):
    assert_refused_before_measuring(cli, two_dirs, args, needle)


def test_a_directory_named_like_a_tier_is_reachable_as_a_path(cli, two_dirs, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cephfs").mkdir()
    result = cli("compare", "./cephfs", "--size", "1PiB")  # fails on the size, after resolving the target
    assert result.exit_code == 2 and "tier cephfs" not in result.stderr


# -- the pure parts ------------------------------------------------------------------------------------


def test_shipped_tiers_load_and_document_every_key_they_use():
    assert {"local-nvme", "cephfs", "s3-standard"} <= set(tier_names())
    for name in tier_names():
        tier = load_tier(name)
        assert tier.name == name and tier.url and tier.notes
        text = (configs_dir() / "tiers" / f"{name}.toml").read_text()
        comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
        keys = [line.split("=")[0].strip() for line in text.splitlines()
                if "=" in line and not line.lstrip().startswith(("#", "["))]
        for key in keys:
            assert key in comments, f"{name}: key {key!r} is not documented in a comment"
        for key in ("cost_per_gb_month_usd", "cost_per_gib_month_usd", "cost_per_1000_put_usd"):
            assert f"{key}" in comments and "USD" in comments
    s3 = load_tier("s3-standard")
    assert s3.prices.per_gb_month_usd == pytest.approx(0.023 * 1e9 / 2**30)  # AWS's GB is 2^30 bytes
    assert s3.prices.per_1000_put_usd == 0.005 and s3.prices.per_1000_get_usd == 0.0004
    assert load_tier("local-nvme").prices.per_gb_month_usd == 0.0
    assert not load_tier("cephfs").prices.given


@pytest.mark.parametrize(("data", "needle"), [
    ({}, "has no url"),
    ({"url": "/x", "colour": "red"}, "unknown key 'colour'"),
    ({"url": "s3://b/p", "storage_options": {"secret": "hunter2"}}, "is a credential"),
    ({"url": "s3://b/p", "storage_options": {"aws_access_key_id": "AKIA"}}, "is a credential"),
    ({"url": "/x", "cost_per_1000_put_usd": 0.005}, "request prices apply to object storage"),
    ({"url": "/x", "storage_options": {"part_size": "8MiB"}}, "apply to object storage"),
    ({"url": "/x", "cost_per_gb_month_usd": 1, "cost_per_gib_month_usd": 1}, "both"),
    ({"url": "/x", "cost_per_gb_month_usd": -1}, "zero or more"),
    ({"url": "/x", "cost_per_gb_month_usd": "cheap"}, "zero or more"),
    ({"url": 3}, "url must be"),
])
def test_bad_tier_files_are_refused_by_name(data, needle):
    with pytest.raises(ConfigError, match=None) as info:
        tier_from_mapping("mine", data)
    assert needle in str(info.value) and "'mine'" in str(info.value)
    assert "hunter2" not in str(info.value) and "AKIA" not in str(info.value)


def test_object_requests_count_multipart_uploads_and_ranged_reads():
    # 1 GiB per rank in 256 MiB shards, 16 MiB parts: 4 shards x (16 parts + create + complete) + manifest.
    r = object_requests(2**30, 2, 256 * MiB, 16 * MiB)
    assert r.objects_per_checkpoint == 2 * 5
    assert r.put_per_checkpoint == 2 * (4 * 18 + 1)
    assert r.get_per_restore == 2 * (4 * 16 + 1)
    small = object_requests(10 * MiB, 1, 256 * MiB, 16 * MiB)  # one shard, one PUT
    assert (small.objects_per_checkpoint, small.put_per_checkpoint, small.get_per_restore) == (2, 2, 2)


def test_run_bill_adds_storage_and_requests():
    prices = TierPrices(per_gb_month_usd=0.02, per_1000_put_usd=0.005, per_1000_get_usd=0.0004)
    requests = object_requests(2**30, 1, 256 * MiB, 16 * MiB)
    use = RunUse(retained_bytes=2 * 10**11, wall_s=SECONDS_PER_MONTH, checkpoints=100, restores=4,
                 requests=requests)
    bill = run_bill(prices, use)
    assert bill["storage_usd"] == pytest.approx(200 * 0.02)
    assert bill["put_usd"] == pytest.approx(100 * requests.put_per_checkpoint / 1000 * 0.005)
    assert bill["get_usd"] == pytest.approx(4 * requests.get_per_restore / 1000 * 0.0004)
    assert bill["total_usd"] == pytest.approx(bill["storage_usd"] + bill["put_usd"] + bill["get_usd"])
    assert bill["complete"] is True
    assert run_bill(TierPrices(), use) is None
    unknown_count = run_bill(prices, RunUse(10**9, SECONDS_PER_MONTH, None, 0, requests))
    assert unknown_count["put_usd"] is None and unknown_count["complete"] is False


def _job(**kwargs) -> JobSpec:
    size = sizing.checkpoint_size(1e9, sizing.TrainingRecipe(), sizing.Parallelism(dp=kwargs.pop("ranks", 1)))
    return JobSpec(size=size, model=None, **kwargs)


MEASURED = Measured(workload_bytes=10**8, save_gbps=1.0, load_gbps=2.0, stall_s=0.01, persist_s=0.1,
                    interference=0.5, save_cached=False, load_cached=False, files=2, disk_bytes=10**8)


def test_model_tier_scales_the_measurements_to_the_job():
    job = _job(failures=FailureModel(3 * 3600.0), restart_s=60.0)
    m = model_tier(job, MEASURED, TierPrices(), part_bytes=None)
    assert m.checkpoint_s == pytest.approx(14.0)  # 14 GB at 1 GB/s
    assert m.restore_s == pytest.approx(7.0) and m.restart_s == pytest.approx(67.0)
    assert m.stall_s == pytest.approx(1.4) and m.persist_s == pytest.approx(14.0)
    expected = interval.analyse(interval.CheckpointCost(1.4, 14.0), 3 * 3600.0, 67.0)
    assert m.optimal_interval_s == pytest.approx(expected.optimal_interval_s)
    assert m.failures_per_run == pytest.approx(m.wall_s / (3 * 3600))
    sync = model_tier(_job(failures=FailureModel(3 * 3600.0), mode="sync"), MEASURED, TierPrices(), part_bytes=None)
    assert sync.blocking_s == pytest.approx(14.0) and sync.overhead_fraction > m.overhead_fraction


def test_an_interval_too_short_for_the_persist_keeps_the_optimum():
    job = _job(failures=FailureModel(3 * 3600.0), every_s=5.0)  # persist 14 s: two checkpoints in flight
    m = model_tier(job, MEASURED, TierPrices(), part_bytes=None)
    assert m.interval_error and "two checkpoints in flight" in m.interval_error
    assert m.error is None and m.optimal_interval_s > 14 and m.interval_s is None
    assert m.checkpoints_per_run == pytest.approx(job.run_s / m.optimal_interval_s)


def test_a_tier_measured_on_the_training_device_uses_its_own_interference():
    job = _job(failures=FailureModel(3 * 3600.0), interference=0.02)
    assumed = model_tier(job, MEASURED, TierPrices(), part_bytes=None)
    measured = model_tier(_job(failures=FailureModel(3 * 3600.0), interference=0.02, interference_measured=True),
                          MEASURED, TierPrices(), part_bytes=None)
    assert assumed.interference == 0.02
    assert measured.interference == pytest.approx(1 / 3)  # the probe ran 1.5x slower: a third of throughput lost
    assert measured.overhead_fraction > assumed.overhead_fraction
    no_steps = dataclasses.replace(MEASURED, interference=None)  # no probe step finished during the persist
    fallback = model_tier(_job(failures=FailureModel(3 * 3600.0), interference=0.02, interference_measured=True),
                          no_steps, TierPrices(), part_bytes=None)
    assert fallback.interference == 0.02
    sync = model_tier(_job(failures=FailureModel(3 * 3600.0), mode="sync", interference_measured=True), MEASURED,
                      TierPrices(), part_bytes=None)
    assert sync.interference == 0.0


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_refused_before_measuring(cli, two_dirs):
    assert_refused_before_measuring(cli, two_dirs, ["{a}", "--device", "cuda"], "--device cuda needs a CUDA GPU")


def test_model_tier_reports_a_tier_that_cannot_keep_up():
    job = _job(failures=FailureModel(10.0), mode="sync")  # a 14 s checkpoint, a failure every 10 s
    m = model_tier(job, MEASURED, TierPrices(per_gb_month_usd=1.0), part_bytes=None)
    assert m.error and "cannot keep up" in m.error
    assert m.optimal_interval_s is None and m.checkpoint_s == pytest.approx(14.0)
    assert m.bill["storage_usd"] > 0


def test_job_spec_refuses_contradictions():
    with pytest.raises(UsageError, match="asynchronous"):
        _job(failures=None, mode="sync", interference=0.1)
    with pytest.raises(UsageError, match="keep"):
        _job(failures=None, keep=0)


def _tier(label: str, runs_save: tuple[float, ...], waste: float) -> Any:
    from ckptbench.bench.tier_comparison import CompareTarget, TierResult

    measured = dataclasses.replace(MEASURED, save_gbps=statistics.median(runs_save), runs_save_gbps=runs_save)
    model = TierModel(checkpoint_s=1.0, stall_s=None, persist_s=None, restore_s=1.0, restart_s=1.0, blocking_s=1.0,
                      waste_fraction=waste)
    return TierResult(CompareTarget(label, label, storage=None), report=None, measured=measured, model=model,
                      model_ends=(dataclasses.replace(model, waste_fraction=waste * 0.9),
                                  dataclasses.replace(model, waste_fraction=waste * 1.1)))


def test_best_only_beyond_the_noise_else_tied():
    from ckptbench.bench.tier_comparison import CompareReport
    from ckptbench.cli.compare import takeaway

    def report(*tiers):
        return CompareReport(spec=None, job=None, workload=None, tiers=tiers, environment={})

    apart = report(_tier("nvme", (2.0, 2.1, 2.2), 0.01), _tier("nfs", (0.5, 0.6, 0.7), 0.05))
    assert apart.best()["save_gbps"] == "nvme" and apart.best()["waste_fraction"] == "nvme"
    assert "save_gbps" not in apart.tied() and "waste_fraction" not in apart.tied()
    assert apart.tied()["load_gbps"] == ["nvme", "nfs"]  # equal runs: neither beats the other
    close = report(_tier("ext4", (0.81, 0.88, 1.17), 0.0100), _tier("tmpfs", (0.70, 1.20, 1.25), 0.0102))
    assert "save_gbps" not in close.best() and close.tied()["save_gbps"] == ["tmpfs", "ext4"]
    assert close.tied()["waste_fraction"] == ["ext4", "tmpfs"]
    doc = {"best": close.best(), "tied": close.tied(),
           "tiers": [{"label": t.label, "model": t.model.to_dict()} for t in close.tiers]}
    assert takeaway(doc).startswith("Least waste: tied between ext4 and tmpfs")
    single = report(_tier("a", (1.0,), 0.01), _tier("b", (2.0,), 0.02))  # one run each: no spread to judge by
    assert not single.best() and single.tied()["save_gbps"] == ["b", "a"]


def test_a_writer_bound_tier_is_named():
    from ckptbench.bench.tier_comparison import CompareReport

    job = _job(failures=None)
    tiers = (dataclasses.replace(_tier("/dev/shm", (0.69, 0.70, 0.71), 0.01),
                                 bottleneck={"limit": "writer", "writer_ceiling_bps": 0.72e9}),
             dataclasses.replace(_tier("/var/tmp", (0.80, 0.81, 0.82), 0.01),
                                 bottleneck={"limit": "storage", "writer_ceiling_bps": 0.72e9}))
    notes = CompareReport(spec=None, job=job, workload=None, tiers=tiers, environment={}).notes()
    [note] = [n for n in notes if n.startswith("writer-bound")]
    assert "/dev/shm" in note and "/var/tmp" not in note and "0.72 GB/s" in note


RESULTS = Path(__file__).resolve().parents[2] / "results"
SHOOTOUT = RESULTS / "bench-checkpoint-vm-20261127T063129.json"
SWEEP = RESULTS / "bench-vm-20261126T042848.json"


def test_a_tier_measured_earlier_sits_beside_one_measured_now(cli, tmp_path: Path):
    doc = cli.json("compare", str(tmp_path), "--from", str(SHOOTOUT), *QUICK, "--params", "1B", "--mtbf", "1d")
    now, earlier = doc["tiers"]
    assert now["saved_from"] is None and earlier["saved_from"] == str(SHOOTOUT)
    saved = json.loads(SHOOTOUT.read_text())
    ours = next(r for r in saved["results"] if r["writer"] == "ckptbench")
    assert earlier["measured"]["save_gbps"] == ours["save"]["gbps"]
    assert earlier["measured"]["runs_save_gbps"] == ours["save"]["runs_gbps"]
    assert earlier["model"]["checkpoint_s"] == pytest.approx(doc["job"]["rank_bytes"] / (ours["save"]["gbps"] * 1e9))
    assert earlier["label"].endswith(f"({SHOOTOUT.name})") and earlier["bench"]["created"] == saved["created"]
    assert any(n.startswith("measured earlier, not in this run") for n in doc["notes"])
    only = cli.json("compare", "--from", str(SHOOTOUT), "--from", str(RESULTS / "compare-vm-20261126T071623.json"),
                    "--params", "1B", "--mtbf", "1d")
    assert len(only["tiers"]) == 4 and all(t["saved_from"] for t in only["tiers"])  # nothing measured at all
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("content", "needle"), [
    (None, "holds no tier measured with the writer"),  # a filesystem sweep
    ({"schema": "ckptbench.bench.checkpoint/1", "target": "/x", "results": []}, "needs ckptbench's writer"),
    ({"schema": "ckptbench.bench.checkpoint/1"}, "not a well-formed"),
])
def test_from_a_file_without_a_tier_is_one_line(cli, tmp_path: Path, content, needle):
    path = SWEEP
    if content is not None:
        path = tmp_path / "r.json"
        path.write_text(json.dumps(content))
    result = cli("compare", "--from", str(path), "--params", "1B", "--mtbf", "1d")
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr

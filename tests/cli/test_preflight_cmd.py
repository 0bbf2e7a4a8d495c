"""``ckptbench preflight``: a real (tiny) measurement with the writer, verdicts and exit codes, JSON,
the run config, and bad input (exit 2, one line, nothing written)."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest

from ckptbench.checkpoint import host_memory
from ckptbench.cli.preflight import session_runs
from ckptbench.decide.scaling import fit_sizes, widen_end
from ckptbench.decide.verdict import EXIT_CODES

REPO = Path(__file__).resolve().parents[2]
TINY = ["--measure-size", "24MiB", "--repeat", "1", "--measure-time", "0"]


def test_small_job_passes_with_json_and_plot(cli, tmp_path: Path):
    target = tmp_path / "t"
    target.mkdir()
    result = cli("preflight", str(target), *TINY, "--params", "100M", "--ranks", "1", "--mtbf", "1d",
                 "--max-ckpt-time", "60s", "--json", "--plot", str(tmp_path / "waste.png"),
                 "--output", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "ckptbench.preflight/1" and doc["verdict"] in ("PASS", "WARN")
    names = [c["name"] for c in doc["checks"]]
    assert names == ["checkpoint-time", "overhead", "free-space", "host-memory", "write-bandwidth-sanity",
                     "read-bandwidth-sanity", "restore"]
    m, p = doc["measurements"], doc["predictions"]
    assert m["write_bps"] > 0 and m["read_bps"] > 0 and m["checkpoint_bench"]["results"][0]["verified"]
    assert p["checkpoint_total_bytes"] == pytest.approx(100e6 * 14, rel=1e-6)  # bf16 + fp32 master + Adam
    assert p["sync_checkpoint_s"] == pytest.approx(p["checkpoint_per_node_bytes"] / m["write_bps"])
    assert {a["setting"] for a in doc["recommendation"]} >= {"interval_s", "async", "threads"}
    # one writer measured at two sizes, the times fitted and read at the node's bytes
    scaling = m["checkpoint_bench"]["scaling"]
    small, large = scaling["sizes_bytes"]
    assert m["shape"] == "sample" and m["writers"] == 1 and small < large == m["sampled_bytes"] == m["per_rank_bytes"]
    assert m["measured_bytes"] == p["checkpoint_per_node_bytes"] == scaling["target_bytes"]
    fitted = scaling["fitted"]["save"]
    # a write past the write-back cache, with its per-second timeline; a drop to a sustained rate slows the save
    sustained = m["sustained"]
    assert sustained["bytes"] >= large and sum(sustained["timeline"]["bytes"]) == sustained["bytes"]
    assert 0.1 <= sustained["timeline"]["interval_s"] <= 1.0 and sustained["steady_state"]["state"]
    assert sustained["used"] == (sustained["slowdown"] > 1)
    slower = sustained["slowdown"]
    assert m["write_bps"] == pytest.approx(m["measured_bytes"] / fitted["point_s"] / slower)
    assert m["write_bps_range"] == pytest.approx([m["measured_bytes"] / fitted["high_s"] / slower,
                                                  m["measured_bytes"] / fitted["low_s"] / slower])
    for key in ("sync_checkpoint_s", "async_stall_s", "restore_s", "overhead_fraction", "goodput"):
        low, high = p[f"{key}_range"]
        assert low <= p[key] <= high, key
    # the restore's fresh memory faulted in: the restore's slow end no faster than it
    fresh = m["fresh_memory"]
    assert fresh["target_bytes"] == p["checkpoint_per_node_bytes"] and fresh["faulted_bytes"] > 0
    assert p["restore_s_range"][1] >= p["checkpoint_per_node_bytes"] / fresh["bps"] * (1 - 1e-9)
    assert m["hypervisor_reclaims"] == fresh["hypervisor_reclaims"]
    assert m["proactive_reclaim_s"] == host_memory.proactive_reclaim()
    low, high = p["optimal_interval_plateau_s"]
    interval = next(a["value"] for a in doc["recommendation"] if a["setting"] == "interval_s")
    assert low <= interval <= high
    assert p["interference_source"].startswith("assumed") and "probe_interference" in m
    assert doc["model"]["curve"] and (tmp_path / "waste.png").read_bytes()[:4] == b"\x89PNG"
    assert len(list((tmp_path / "out").glob("preflight-*.json"))) == 1
    assert list(target.iterdir()) == []  # scratch removed


def test_a_node_that_fits_is_measured_at_its_own_bytes(cli, tmp_path: Path):
    # 4M parameters: a 56 MB checkpoint on one rank, within --measure-time and this host's memory
    result = cli("preflight", str(tmp_path), "--measure-size", "16MiB", "--repeat", "2", "--params", "4M",
                 "--ranks", "1", "--mtbf", "1d", "--max-ckpt-time", "60s", "--json")
    assert result.exit_code in (0, 3), result.stderr
    doc = json.loads(result.stdout)
    m, p = doc["measurements"], doc["predictions"]
    scaling = m["checkpoint_bench"]["scaling"]
    sizes, target = scaling["sizes_bytes"], scaling["target_bytes"]
    assert len(sizes) == 3 and sizes[0] < sizes[1] < sizes[2] and abs(sizes[2] / target - 1) <= 0.05
    assert m["sampled_bytes"] == sizes[2] and p["extrapolation_factor"] > 1  # a sample, not the job's rank
    saves = scaling["runs_s"]["save"][2]
    # the largest size in fresh processes sharing its runs (--repeat 2, and up to twice that where the
    # budget leaves time), their runs pooled
    repeat = scaling["largest_repeat"]
    assert 2 <= repeat <= 4 and len(saves) == repeat
    sessions = scaling["largest_sessions"]
    assert len(sessions) == len(session_runs(repeat)) >= 2
    assert sorted(statistics.median(r) for r in _split(saves, session_runs(repeat))) == pytest.approx(
        sorted(s["save"] for s in sessions))
    assert len(scaling["runs_s"]["save"][1]) == 2  # the sizes before it: --repeat runs in one process
    k = target / sizes[2]
    assert p["sync_checkpoint_s"] == pytest.approx(statistics.median(saves) * k)
    low, high = p["sync_checkpoint_s_range"]
    assert low <= min(saves) * k and high >= max(saves) * k  # the runs' own spread, at least
    fitted = fit_sizes(sizes, scaling["runs_s"]["save"], target, min_slope=1 / scaling["fastest_bps"]["save"])
    k = p["extrapolation_factor"]
    assert [low, high] == pytest.approx([widen_end(fitted.point_s, fitted.low_s, k, up=False),
                                         widen_end(fitted.point_s, fitted.high_s, k, up=True)])
    assert list(tmp_path.iterdir()) == []


def _split(runs: list[float], counts: list[int]) -> list[list[float]]:
    """``runs`` cut into consecutive pieces of ``counts``."""
    ends = list(itertools.accumulate(counts))
    return [runs[e - n:e] for n, e in zip(counts, ends, strict=True)]


def test_the_largest_samples_runs_are_shared_between_sessions():
    assert session_runs(3) == [2, 1] and session_runs(4) == [2, 2] and session_runs(2) == [1, 1]
    assert session_runs(1) == [1]  # one run cannot be shared: one session
    assert session_runs(5) == [3, 2] and session_runs(6) == [2, 2, 2] and session_runs(7) == [3, 2, 2]


def test_a_failing_check_exits_1_with_the_reason(cli, tmp_path: Path, monkeypatch):
    from ckptbench import knobs

    # one writer measures the sample: the verdict is the point here (a node's writers at once:
    # test_a_node_of_several_ranks_is_measured_with_that_many_writers_at_once)
    monkeypatch.setattr(knobs, "SAMPLE_RANKS_MAX", 1)
    result = cli("preflight", str(tmp_path), *TINY, "--params", "70B", "--ranks", "8", "--mtbf", "1d")
    assert result.exit_code == 1, result.stderr
    assert "verdict: FAIL" in result.stdout
    assert "FAIL" in result.stdout.split("checks")[1]


def test_run_config_feeds_the_job(cli, tmp_path: Path, monkeypatch):
    from ckptbench import knobs

    monkeypatch.setattr(knobs, "SAMPLE_RANKS_MAX", 1)  # one writer measures the sample: the job is the point here
    result = cli("--config", str(REPO / "configs/runs/llama3-70b-512gpu.toml"), "preflight", str(tmp_path), *TINY,
                 "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == EXIT_CODES[doc["verdict"]]  # this small host may lack the memory
    job = doc["job"]
    assert (job["model"], job["ranks"], job["nodes"], job["checkpoint"]["parallelism"]["sharding"]) == (
        "llama3-70b", 512, 64, "zero1")
    assert job["aggregate_bps"] == 20e9 and job["gpu_hour_usd"] == 2.5
    assert doc["predictions"]["wasted_usd_per_day"] > 0


@pytest.mark.parametrize(("args", "needle"), [
    (["--model", "gpt-17"], "llama3-8b"),  # unknown preset: the known ones are listed
    (["--model", "llama3-8b", "--params", "7B"], "both give the model size"),
    (["--ranks", "10", "--tp", "4"], "not a multiple"),
    (["--interval", "soon"], "duration"),
    (["--restart", "1m1m"], "'1m' repeats a unit"),
    (["--interval", "30m1h"], "'1h' comes after a smaller unit"),
    (["--measure-size", "512Mb"], "is in bits"),
    (["--max-overhead", "0"], "max-overhead"),
    (["--mtbf", "3h", "--failures", "llama3"], "both give the failure rate"),
    (["--weights-only", "--optimizer", "sgd"], "contradict"),
    (["--storage-option", "part_size=8MiB"], "apply to object storage"),
    (["--measure-size", "1PiB"], "is more than"),
    (["{missing}"], "does not exist"),
    (["--node-memory", "0"], "--node-memory"),
    (["--node-network", "0"], "--node-network"),
    (["--device", "tpu"], "--device 'tpu' must be cpu, cuda or cuda:N"),
])
def test_bad_input(cli, tmp_path: Path, args, needle):
    target = tmp_path / "t"
    target.mkdir()
    args = [str(tmp_path / "missing") if a == "{missing}" else a for a in args]
    result = cli("preflight", *(args if args[0].startswith("/") else [str(target), *args]))
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert list(target.iterdir()) == []


@pytest.mark.parametrize(("args", "needle"), [
    (["--restart", "1000d", "--mtbf", "1h"], "restart 1000d is 24,000 times the MTBF (1h)"),
    (["--interval", "1000d", "--mtbf", "1h"], "interval 1000d is 24,000 times the MTBF (1h)"),
    (["--restart", "500d", "--interval", "500d", "--mtbf", "1h"], "times the MTBF (1h)"),
])
def test_a_job_that_never_completes_is_refused_before_anything_is_measured(cli, tmp_path: Path, monkeypatch, args,
                                                                           needle):
    """Whatever the storage does, a restart or an interval hundreds of MTBFs long cannot work: no measuring."""
    from ckptbench.bench import shootout

    def measure(*args, **kwargs):
        raise AssertionError("the storage was measured before the job was refused")

    monkeypatch.setattr(shootout, "run_checkpoint_bench", measure)
    result = cli("preflight", str(tmp_path), *TINY, *args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


def test_a_range_across_a_threshold_exits_3_borderline(cli, tmp_path: Path, monkeypatch):
    """A sample so uncertain that the stall could be anything: the check cannot say PASS or FAIL."""
    from ckptbench import knobs
    from ckptbench.storage.local_target import LocalDirectory

    monkeypatch.setattr(knobs, "SAMPLE_EXTRAPOLATION", 1e4)
    # the job's 3 retained checkpoints (16.8 GB) fit whatever this machine's disk has free: the check
    # judged here is the checkpoint time, not the free space
    monkeypatch.setattr(LocalDirectory, "free_bytes", lambda self: 1 << 50)
    result = cli("preflight", str(tmp_path), *TINY, "--params", "400M", "--ranks", "2", "--gpus-per-node", "2",
                 "--mtbf", "30d", "--max-ckpt-time", "30s", "--json")
    assert result.exit_code == 3, result.stderr
    doc = json.loads(result.stdout)
    check = next(c for c in doc["checks"] if c["name"] == "checkpoint-time")
    assert doc["verdict"] == "BORDERLINE" and check["status"] == "BORDERLINE"
    assert "torchrun/srun" in check["remedy"]


def test_help_documents_the_exit_statuses(cli):
    text = cli("preflight", "--help").stdout
    assert "3 BORDERLINE" in text and "1 FAIL" in text and "2 bad input" in text


def test_a_node_of_several_ranks_is_measured_with_that_many_writers_at_once(cli, tmp_path: Path, monkeypatch):
    from ckptbench import knobs

    monkeypatch.setattr(knobs, "SAMPLE_RANKS_MAX", 2)
    result = cli("preflight", str(tmp_path), *TINY, "--params", "100M", "--ranks", "8", "--gpus-per-node", "4",
                 "--mtbf", "1d", "--max-ckpt-time", "10m", "--json")
    assert result.exit_code in (0, 3), result.stderr
    doc = json.loads(result.stdout)
    m, p = doc["measurements"], doc["predictions"]
    together = m["checkpoint_bench"]["together"]
    assert together["schema"] == "ckptbench.bench.distributed/1" and together["launch"]["world_size"] == 2
    assert m["shape"] == "sample" and m["writers"] == 2 and m["per_rank_bytes"] == max(together["rank_bytes"])
    # the node's times: the writers together at two sizes (all their bytes, the slowest one's time), fitted
    scaling = m["checkpoint_bench"]["scaling"]
    assert scaling["writers"] == 2 and scaling["sizes_bytes"][1] == sum(together["rank_bytes"])
    durations = [r["duration_s"] for r in together["rounds"]["save"]]
    assert scaling["runs_s"]["save"][1] == durations
    # every rank's engine timeline, and their sum per round in the summary
    for op in ("save", "load"):
        rounds, runs = together["rounds"][op], together["summary"][op]["timeline"]["runs"]
        assert [sum(run["bytes"]) for run in runs] == [
            sum(sum(rank["timeline"]["bytes"]) for rank in r["ranks"]) for r in rounds]
        assert all(sum(rank["timeline"]["bytes"]) >= rank["bytes"] for r in rounds for rank in r["ranks"])
    assert m["measured_bytes"] == scaling["target_bytes"] == p["checkpoint_per_node_bytes"]
    assert p["extrapolation_factor"] > 1  # 2 writers measured for a node of 4 ranks
    assert m["bottleneck"]["limit"] in ("writer", "storage", "unknown") and m["bottleneck"]["writer_ceiling_bps"] > 0
    assert list(tmp_path.iterdir()) == []  # every writer's scratch removed


def test_the_bottleneck_is_named():
    from ckptbench.bench.ceiling import bottleneck

    assert bottleneck(1.9e9, [2.0e9, 1.8e9])["limit"] == "writer"  # 95 % of what it does into memory
    assert bottleneck(0.5e9, [2.0e9])["limit"] == "storage"
    assert bottleneck(0.5e9, None)["limit"] == "unknown"
    assert bottleneck(3.0e9, [2.0e9])["limit"] == "unknown"  # above what the writer does into memory: disturbed


def test_a_drop_to_a_sustained_rate_is_what_the_prediction_uses(cli, tmp_path: Path, monkeypatch):
    """The write past the write-back cache found a burst (a stand-in with a known timeline): the node's
    bytes past it go at the sustained rate, and the output and the JSON say so."""
    from ckptbench.bench import sustained
    from ckptbench.bench.timeline import Timeline, detect

    burst = Timeline(1.0, (100_000_000,) * 3 + (10_000_000,) * 8, 11.0)  # 0.1 GB/s, then 10 MB/s

    def fake(target, nbytes, **kwargs):
        return sustained.SustainedWrite(burst.total_bytes, 11.0, burst, detect(burst), kwargs["reason"], True,
                                        kwargs["limits"])

    monkeypatch.setattr(sustained, "run_sustained_write", fake)
    args = ("preflight", str(tmp_path), *TINY, "--params", "100M", "--ranks", "1", "--mtbf", "1d",
            "--max-ckpt-time", "1h")
    result = cli(*args, "--json")
    assert result.exit_code in (0, 1, 3), result.stderr  # the verdict is not the point here
    doc = json.loads(result.stdout)
    s, m = doc["measurements"]["sustained"], doc["measurements"]
    assert s["steady_state"]["state"] == "burst" and s["steady_state"]["burst_bytes"] == 300_000_000
    assert s["used"] and s["slowdown"] > 1
    assert m["write_bps"] == pytest.approx(s["fitted_write_bps"] / s["slowdown"])
    assert s["timeline"]["bytes"] == list(burst.bytes)
    text = cli(*args).stdout
    assert "write-back cache" in text and "sustained" in text


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_one_line_before_anything_is_measured(cli, tmp_path: Path):
    target = tmp_path / "t"
    target.mkdir()
    result = cli("preflight", str(target), *TINY, "--device", "cuda")
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda needs a CUDA GPU" in lines[0], lines
    assert list(target.iterdir()) == []


def test_a_cpu_measurement_records_its_device_and_assumes_the_interference(cli, tmp_path: Path):
    target = tmp_path / "t"
    target.mkdir()
    doc = cli.json("preflight", str(target), *TINY, "--params", "100M", "--ranks", "1", "--mtbf", "1d",
                   "--max-ckpt-time", "60s", "--device", "cpu")
    m, p = doc["measurements"], doc["predictions"]
    assert m["device"] == "cpu" and m["interference"] is None and m["interference_range"] is None
    assert p["interference_source"].startswith("assumed")


def test_a_further_sample_runs_in_a_fresh_process_with_the_settled_writer_settings(tmp_path: Path):
    from ckptbench.bench.local_ranks import run_sample_fresh
    from ckptbench.bench.shootout import CheckpointBenchSpec

    spec = CheckpointBenchSpec(size_bytes=8 * 2**20, repeat=1, warmup=0, memory_saves=0)
    doc = run_sample_fresh(spec, str(tmp_path), settings={"CKPTBENCH_SAVE_THREADS": "3",
                                                          "CKPTBENCH_SAVE_DIRECT": "0"})
    ours = next(r for r in doc["results"] if r["writer"] == "ckptbench")
    assert ours["details"]["threads"] == 3 and ours["details"]["direct"] is False and ours["verified"]
    assert list(tmp_path.iterdir()) == []
    from ckptbench.errors import StorageIOError

    with pytest.raises(StorageIOError, match="the sample of .* failed: .*does not exist"):
        run_sample_fresh(spec, str(tmp_path / "missing"), settings={})


def test_the_fresh_memory_probe_can_be_turned_off(cli, tmp_path: Path, monkeypatch):
    from ckptbench import knobs
    from ckptbench.checkpoint.host_memory import reports_free_memory

    monkeypatch.setattr(knobs, "FRESH_MEMORY_SHARE", 0.0)  # CKPTBENCH_FRESH_MEMORY_SHARE=0
    doc = cli.json("preflight", str(tmp_path), *TINY, "--params", "100M", "--ranks", "1", "--mtbf", "1d")
    m = doc["measurements"]
    assert m["fresh_memory"] is None and m["hypervisor_reclaims"] == reports_free_memory()
    assert not any("fresh memory" in a for a in doc["assumptions"])


def test_on_object_storage_the_recommendation_has_no_filesystem_settings(cli):
    """O_DIRECT and the block size are a filesystem's: a preflight of an object store (memory:// here, as
    s3://) recommends neither (it recommended "direct = False: O_DIRECT is not available here")."""
    result = cli("preflight", "memory://preflight", "--measure-size", "8MiB", "--repeat", "1", "--measure-time",
                 "0", "--json")
    assert result.exit_code in (0, 1, 3), result.stderr  # the verdict (FAIL on a busy host) is not the point here
    settings = [a["setting"] for a in json.loads(result.stdout)["recommendation"]]
    assert "threads" in settings and "interval_s" in settings
    assert "direct" not in settings and "block_size_bytes" not in settings

"""One job model across commands: the same job is sized the same way and gets the same interference,
whichever command describes it; `--from` takes a measurement instead of hand-copied numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptbench.model.interference import ASSUMED

REPO = Path(__file__).resolve().parents[2]
PREFLIGHT = REPO / "results" / "preflight-vm-20261126T071318.json"
SHOOTOUT = REPO / "results" / "bench-checkpoint-vm-20261127T063129.json"
SWEEP = REPO / "results" / "bench-vm-20261126T042848.json"


def test_every_command_sizes_the_job_and_counts_interference_alike(cli, tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    result = cli("preflight", str(a), "--model", "llama3-70b", "--ranks", "1", "--gpus-per-node", "1", "--mtbf", "30d",
                 "--measure-size", "24MiB", "--measure-time", "0", "--repeat", "1", "--max-ckpt-time", "1d",
                 "--json")
    assert result.exit_code in (0, 1, 3), result.stderr  # 988 GB on one node may not fit this disk: FAIL is fine
    preflight = json.loads(result.stdout)
    compare = cli.json("compare", str(a), str(b), "--model", "llama3-70b", "--ranks", "1", "--mtbf", "30d",
                       "--size", "24MiB", "--repeat", "1", "--warmup", "0")
    interval = cli.json("interval", "--model", "llama3-70b", "--bandwidth", "1GB/s", "--stall", "1s", "--mtbf", "30d")
    sizes = {preflight["predictions"]["checkpoint_total_bytes"], compare["job"]["checkpoint_bytes"],
             interval["checkpoint_bytes"]}
    assert len(sizes) == 1 and sizes.pop() == pytest.approx(70.6e9 * 14, rel=0.01)
    assert preflight["predictions"]["interference"] == compare["job"]["interference"] == interval["interference"] \
        == ASSUMED.point
    assert preflight["predictions"]["interference_source"] == interval["interference_source"] == ASSUMED.source


def test_interval_from_a_preflight_takes_the_nodes_checkpoint_and_its_async_rates(cli):
    doc = cli.json("interval", "--from", str(PREFLIGHT), "--mtbf", "1d")
    pre = json.loads(PREFLIGHT.read_text())
    m, p = pre["measurements"], pre["predictions"]
    assert doc["checkpoint_bytes"] == p["checkpoint_per_node_bytes"]
    assert doc["bandwidth_bytes_per_s"] == pytest.approx(m["write_bps"])
    assert doc["mode"] == "async"
    assert doc["stall_s"] == pytest.approx(p["checkpoint_per_node_bytes"] * m["async_stall_s"] / m["measured_bytes"])
    assert doc["persist_s"] == pytest.approx(p["checkpoint_per_node_bytes"] * m["async_persist_s"] / m["measured_bytes"])
    assert any(str(PREFLIGHT) in note for note in doc["notes"])


def test_interval_from_a_shootout_needs_the_bytes(cli):
    result = cli("interval", "--from", str(SHOOTOUT), "--mtbf", "1d")
    assert result.exit_code == 2 and "gives rates, not the checkpoint's bytes" in result.stderr
    doc = cli.json("interval", "--from", str(SHOOTOUT), "--size", "100GB", "--mtbf", "1d")
    ours = next(r for r in json.loads(SHOOTOUT.read_text())["results"] if r["writer"] == "ckptbench")
    assert doc["bandwidth_bytes_per_s"] == pytest.approx(ours["save"]["gbps"] * 1e9) and doc["mode"] == "async"
    sweep = cli.json("interval", "--from", str(SWEEP), "--size", "100GB", "--mtbf", "1d")
    assert sweep["mode"] == "sync" and sweep["checkpoint_s"] == pytest.approx(100e9 / sweep["bandwidth_bytes_per_s"])


def test_interval_from_a_preflight_takes_its_jobs_failures_and_restart(cli):
    # The same job, the same model: interval --from a preflight gives that preflight's optimum.
    doc = cli.json("interval", "--from", str(PREFLIGHT))
    p = json.loads(PREFLIGHT.read_text())["predictions"]
    assert doc["mtbf_s"] == pytest.approx(p["mtbf_s"]) and str(PREFLIGHT) in doc["failure_source"]
    assert doc["restart_s"] == pytest.approx(p["restart_s"])
    assert doc["optimal_interval_s"] == pytest.approx(p["optimal_interval_s"], rel=1e-6)
    assert not any("no --restart given" in note for note in doc["notes"])
    # what is typed wins; another checkpoint (--size) is another job: its failures and restart are not taken
    typed = cli.json("interval", "--from", str(PREFLIGHT), "--mtbf", "1d", "--restart", "1m")
    assert typed["mtbf_s"] == 86400 and typed["restart_s"] == 60
    other = cli.json("interval", "--from", str(PREFLIGHT), "--size", "1TB")
    assert other["mtbf_s"] is None


def test_goodput_from_a_preflight_takes_its_job(cli):
    doc = cli.json("goodput", "--from", str(PREFLIGHT), "--replace", "10m", "--resume", "5m")
    pre = json.loads(PREFLIGHT.read_text())
    job, p = pre["job"], pre["predictions"]
    assert doc["stall_s"] == pytest.approx(p["async_stall_s"]) and doc["interference"] == p["interference"]
    assert doc["params"] == pytest.approx(job["checkpoint"]["params"], rel=0.005)
    assert (doc["gpus"], doc["gpus_per_node"]) == (job["ranks"], job["ranks_per_node"])
    assert doc["mtbf_s"] == pytest.approx(p["mtbf_s"])
    [interval] = [a["value"] for a in pre["recommendation"] if a["setting"] == "interval_s"]
    taken = {d["option"]: d for d in doc["defaults"]}
    assert taken["--ckpt-interval"]["value"] == interval and str(PREFLIGHT) in taken["--gpus"]["source"]
    # the same job typed out is the same answer; the cost of another job is not this preflight's
    same = cli.json("goodput", "--from", str(PREFLIGHT), "--replace", "10m", "--resume", "5m", "--model",
                    job["model"], "--gpus", str(job["ranks"]), "--ckpt-interval", f"{interval}s")
    assert same["wall_hours"] == pytest.approx(doc["wall_hours"])
    for flag, value in (("--gpus", "512"), ("--params", "70B"), ("--gpus-per-node", "4")):
        result = cli("goodput", "--from", str(PREFLIGHT), "--replace", "10m", "--resume", "5m", flag, value)
        assert result.exit_code == 2 and "is another job" in result.stderr and f"{flag} " in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("command", "args", "needle"), [
    ("interval", ["--from", str(SWEEP), "--bandwidth", "1GB/s", "--size", "1GB"], "both give the checkpoint speed"),
    ("goodput", ["--from", str(SWEEP)], "goodput needs the job's checkpoint"),
    ("interval", ["--from", "{bad}", "--size", "1GB"], "unknown result schema"),
    ("interval", ["--from", "{missing}", "--size", "1GB"], "does not exist"),
    ("interval", ["--from", "{ranks}"], "ranks 'eight' is not a positive whole number"),
    ("goodput", ["--from", "{ranks}", "--replace", "1m", "--resume", "1m"], "not a well-formed"),
])
def test_from_a_file_that_cannot_serve_is_one_line(cli, tmp_path: Path, command, args, needle):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "something.else/1"}))
    ranks = tmp_path / "ranks.json"  # a preflight whose job is not well-formed
    doc = json.loads(PREFLIGHT.read_text())
    doc["job"]["ranks"] = "eight"
    ranks.write_text(json.dumps(doc))
    named = {"{bad}": str(bad), "{missing}": str(tmp_path / "nope.json"), "{ranks}": str(ranks)}
    args = [named.get(a, a) for a in args]
    if command == "goodput" and "--replace" not in args:
        args += ["--params", "70B", "--tokens", "2T", "--gpus", "512", "--peak-tflops", "989", "--mfu", "0.4",
                 "--faults-per-day", "1", "--detect", "5m", "--replace", "10m", "--resume", "5m",
                 "--ckpt-interval", "1h"]
    result = cli(command, *args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr


def _shootout_on(tmp_path: Path, device: str, slowdown: float) -> Path:
    """The reference shoot-out as if its state_dict had lived on ``device``, its probe slowed by ``slowdown``."""
    doc = json.loads(SHOOTOUT.read_text())
    doc["spec"]["device"] = device
    next(a for a in doc["async"] if a["writer"] == "ckptbench")["interference"] = slowdown
    path = tmp_path / f"shootout-{device}.json"
    path.write_text(json.dumps(doc))
    return path


def test_an_interference_measured_on_the_gpu_is_used_where_the_cpu_probe_is_not(cli, tmp_path: Path):
    from ckptbench.model.interference import from_slowdown

    gpu, cpu = _shootout_on(tmp_path, "cuda", 0.25), _shootout_on(tmp_path, "cpu", 0.25)
    assert cli.json("interval", "--from", str(gpu), "--size", "100GB", "--mtbf", "1d")["interference"] \
        == pytest.approx(from_slowdown(0.25))
    assert cli.json("interval", "--from", str(cpu), "--size", "100GB", "--mtbf", "1d")["interference"] == ASSUMED.point
    measured = cli("recommend", str(gpu), "--ckpt-size", "100GB", "--mtbf", "1d")
    assert measured.exit_code == 0, measured.stderr
    assert f"interference {from_slowdown(0.25):.1%}, measured on the training device by {gpu}" in measured.stdout
    assumed = cli("recommend", str(cpu), "--ckpt-size", "100GB", "--mtbf", "1d")
    assert assumed.exit_code == 0 and f"interference {ASSUMED.point:.1%}, assumed" in assumed.stdout


RANGED = REPO / "results" / "preflight-vm-20261128T0614.json"


def test_goodput_from_a_preflight_carries_its_predicted_ranges_into_the_hours(cli, tmp_path: Path):
    """Preflight predicts each checkpoint time as a range; goodput --from it gives every hour it derives from them
    at both ends (the point inside), not one number as if the cost were known exactly. A file without ranges
    (an older preflight) gives none; a malformed range is one line, exit 2."""
    doc = cli.json("goodput", "--from", str(RANGED), "--replace", "30m", "--resume", "10m")
    ranges = doc["ranges"]
    for key in ("wall_hours", "wasted_hours", "goodput"):
        low, high = ranges[key]
        assert low <= doc[key] <= high and low < high, key
    low, high = ranges["badput"]["checkpoint_stall_hours"]
    assert low < doc["badput"]["checkpoint_stall_hours"] < high
    assert high / low > 3  # the stall's own range (and the interference's 0-5 %) spans that much
    fixed = cli.json("goodput", "--from", str(RANGED), "--replace", "30m", "--resume", "10m", "--interference", "2%")
    fixed_low, fixed_high = fixed["ranges"]["badput"]["checkpoint_stall_hours"]
    assert low < fixed_low and fixed_high < high  # a typed interference is no longer uncertain
    table = cli("goodput", "--from", str(RANGED), "--replace", "30m", "--resume", "10m")
    assert "ranges: the same run at both ends of the checkpoint times preflight predicted" in table.stdout
    assert cli.json("goodput", "--from", str(PREFLIGHT), "--replace", "10m", "--resume", "5m")["ranges"] is None
    bad = json.loads(RANGED.read_text())
    bad["predictions"]["async_stall_s_range"] = [0.06, "slow"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    result = cli("goodput", "--from", str(path), "--replace", "30m", "--resume", "10m")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_interval_from_a_preflight_gives_the_optimum_over_its_predicted_ranges(cli):
    """The optimum and its waste at both ends of the predicted checkpoint times and restart: the same range
    preflight's own ``optimal_interval_s_range`` gives; a typed restart or stall is no longer uncertain, and a
    file without ranges, or another checkpoint's --size, gives none."""
    doc = cli.json("interval", "--from", str(RANGED))
    p = json.loads(RANGED.read_text())["predictions"]
    assert doc["ranges"]["optimal_interval_s"] == pytest.approx(p["optimal_interval_s_range"], rel=1e-6)
    low, high = doc["ranges"]["waste_fraction"]
    assert low < doc["waste_fraction"] < high
    typed = cli.json("interval", "--from", str(RANGED), "--restart", "10s")
    assert typed["ranges"]["restart_s"] == [10.0, 10.0]
    fixed = cli.json("interval", "--from", str(RANGED), "--interference", "2%")["ranges"]["blocking_s"]
    assert doc["ranges"]["blocking_s"][0] <= fixed[0] and fixed[1] < doc["ranges"]["blocking_s"][1]
    assert cli.json("interval", "--from", str(RANGED), "--size", "1TB")["ranges"] is None
    assert cli.json("interval", "--from", str(RANGED), "--stall", "1s")["ranges"] is None
    assert cli.json("interval", "--from", str(PREFLIGHT))["ranges"] is None
    table = cli("interval", "--from", str(RANGED))
    assert "ranges: at the fast and the slow end of the checkpoint times and restart preflight predicted" in table.stdout

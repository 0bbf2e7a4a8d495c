"""``ckptbench interval``: JSON, human output, plots, --explain, and one-line errors for bad input."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ckptbench.cli import main

REPO = Path(__file__).resolve().parents[2]


def run(*args: str):
    return CliRunner().invoke(main, ["interval", *args])


def run_json(*args: str) -> dict:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)  # exactly one document


def test_json_sync_has_the_documented_keys_and_values() -> None:
    doc = run_json("--ckpt-time", "5m", "--mtbf", "24h", "--restart", "10m", "--every", "30m")
    for key in ("checkpoint_bytes", "checkpoint_s", "mtbf_s", "young_interval_s", "daly_interval_s",
                "optimal_interval_s", "waste_fraction", "interval_s", "overhead_fraction",
                "waste_fraction_at_interval", "units"):
        assert key in doc
    assert doc["mode"] == "sync"
    assert doc["checkpoint_bytes"] is None
    assert doc["checkpoint_s"] == 300
    assert doc["mtbf_s"] == 86400
    assert doc["young_interval_s"] == pytest.approx(7200)
    assert doc["daly_interval_s"] == pytest.approx(7001.39, abs=0.01)
    assert doc["optimal_interval_s"] == pytest.approx(7001.4, abs=0.1)
    assert doc["overhead_fraction"] == pytest.approx(300 / 1800)
    assert doc["waste_fraction_at_interval"] > doc["waste_fraction"] > 0
    assert doc["units"]["_s"] == "seconds"
    assert doc["assumptions"]


def test_size_and_bandwidth_give_the_checkpoint_time() -> None:
    doc = run_json("--size", "140GB", "--bandwidth", "1GB/s", "--mtbf", "3h")
    assert doc["checkpoint_bytes"] == 140 * 10**9
    assert doc["checkpoint_s"] == pytest.approx(140)
    assert doc["young_interval_s"] == pytest.approx(math.sqrt(2 * 140 * 3 * 3600))


def test_params_are_sized_by_the_recipe() -> None:
    doc = run_json("--params", "70B", "--dtype", "bf16", "--optimizer", "adam", "--bandwidth", "1GB/s")
    assert doc["checkpoint_bytes"] == 980 * 10**9
    assert doc["checkpoint_s"] == pytest.approx(980)
    assert doc["sizing"]["bytes_per_param"] == {"weights": 2, "master_weights": 4, "optimizer": 8, "gradients": 0}
    weights = run_json("--params", "70B", "--weights-only", "--bandwidth", "1GB/s")
    assert weights["checkpoint_bytes"] == 140 * 10**9


def test_model_preset_and_sharding_give_bytes_per_rank() -> None:
    doc = run_json("--model", "llama3-8b", "--bandwidth", "2GB/s", "--dp", "8", "--sharding", "fsdp")
    assert doc["checkpoint_bytes"] == 8_030_261_248 * 14
    assert doc["sizing"]["model"] == "llama3-8b"
    assert doc["sizing"]["per_rank_max_bytes"] == pytest.approx(doc["checkpoint_bytes"] / 8, abs=8)


def test_without_a_failure_rate_only_the_cost_side_is_computed() -> None:
    doc = run_json("--ckpt-time", "140s", "--every", "30m")
    assert doc["checkpoint_s"] == 140
    assert doc["overhead_fraction"] == pytest.approx(140 / 1800)
    assert doc["mtbf_s"] is None and doc["optimal_interval_s"] is None and doc["waste_fraction"] is None
    assert any("failure rate" in note for note in doc["notes"])
    human = run("--ckpt-time", "140s", "--every", "30m")
    assert human.exit_code == 0
    assert "7.78 %" in human.stdout
    assert "failure rate" in human.stdout


def test_failure_rate_from_gpus_and_per_gpu_mtbf_or_preset() -> None:
    doc = run_json("--ckpt-time", "60s", "--gpus", "100000", "--gpu-mtbf", "50000h")
    assert doc["mtbf_s"] == pytest.approx(1800)
    doc = run_json("--ckpt-time", "60s", "--failures", "llama3")
    assert doc["mtbf_s"] == pytest.approx(54 * 86400 / 419)
    assert "llama3" in doc["failure_source"]
    doc = run_json("--ckpt-time", "60s", "--failures", "mlcommons", "--gpus", "100000")
    assert doc["mtbf_s"] == pytest.approx(1800)
    doc = run_json("--ckpt-time", "60s", "--faults-per-day", "2")
    assert doc["mtbf_s"] == 43200
    doc = run_json("--ckpt-time", "60s", "--nodes", "1000", "--node-mtbf", "1000d")
    assert doc["mtbf_s"] == 86400


def test_async_reports_stall_persist_and_the_binding_constraint() -> None:
    doc = run_json("--stall", "1s", "--persist", "60s", "--interference", "0.05", "--mtbf", "3h", "--restart", "10m")
    assert doc["mode"] == "async"
    assert (doc["stall_s"], doc["persist_s"], doc["interference"]) == (1, 60, 0.05)
    assert doc["young_interval_s"] == pytest.approx(math.sqrt(2 * (1 + 3) * 3 * 3600))
    assert doc["constraint_binding"] is False
    bound = run_json("--stall", "5s", "--ckpt-time", "30m", "--mtbf", "4h", "--restart", "10m", "--interference", "0")
    assert bound["persist_s"] == 1800  # --ckpt-time is the persist time of an async checkpoint
    assert bound["constraint_binding"] is True
    assert bound["optimal_interval_s"] == bound["min_interval_s"] == 1800
    assert bound["constraint_cost_fraction"] > 0
    assert any("bound binds" in note for note in bound["notes"])


def test_human_output_has_a_table_and_one_takeaway() -> None:
    result = run("--size", "140GB", "--bandwidth", "1GB/s", "--mtbf", "3h", "--restart", "10m", "--every", "1h")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "Young" in out and "Daly" in out and "optimum" in out and "yours" in out
    # the round value inside the flat optimum, the optimum itself and the plateau's ends
    doc = run_json("--size", "140GB", "--bandwidth", "1GB/s", "--mtbf", "3h", "--restart", "10m", "--every", "1h")
    low, high = doc["optimal_interval_plateau_s"]
    assert low < doc["optimal_interval_s"] < high and low <= doc["recommended_interval_s"] <= high
    assert doc["recommended_interval_s"] % 60 == 0
    assert "Checkpoint every 30m (anything from" in " ".join(out.split()) and "the optimum 27m 27s" in " ".join(out.split())
    assert "every 1h wastes" in out
    assert result.stderr == ""


def test_plot_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "waste.png"
    result = run("--ckpt-time", "140s", "--mtbf", "3h", "--restart", "10m", "--every", "1h", "--plot", str(path))
    assert result.exit_code == 0, result.stderr
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    async_path = tmp_path / "async.png"
    result = run("--stall", "5s", "--persist", "20m", "--mtbf", "4h", "--plot", str(async_path), "--json")
    assert result.exit_code == 0, result.stderr
    assert async_path.read_bytes()[:4] == b"\x89PNG"


def test_simulate_checks_the_model_at_the_optimum_and_at_every() -> None:
    doc = run_json("--ckpt-time", "140s", "--mtbf", "3h", "--restart", "10m", "--every", "1h",
                   "--simulate", "4000", "--work", "10d", "--seed", "3")
    sim = doc["simulation"]
    assert (sim["runs"], sim["seed"], sim["work_s"], sim["weibull_shape"]) == (4000, 3, 864000, 1.0)
    for name in ("at_optimum", "at_interval"):
        row = sim[name]
        assert row["mean_wall_s"] == pytest.approx(row["model_wall_s"], rel=0.01)
        assert row["waste_fraction"] == pytest.approx(row["model_waste_fraction"], abs=0.005)
    assert sim["at_optimum"]["waste_fraction"] < sim["at_interval"]["waste_fraction"]
    assert run_json("--ckpt-time", "140s", "--mtbf", "3h")["simulation"] is None


def test_simulate_with_weibull_failures() -> None:
    doc = run_json("--ckpt-time", "140s", "--mtbf", "3h", "--simulate", "2000", "--work", "5d",
                   "--weibull-shape", "0.6")
    assert doc["simulation"]["weibull_shape"] == 0.6
    human = run("--ckpt-time", "140s", "--mtbf", "3h", "--simulate", "2000", "--work", "5d", "--weibull-shape", "0.6")
    assert human.exit_code == 0, human.stderr
    assert "Monte Carlo check" in human.stdout and "Weibull k=0.6" in human.stdout


def test_explain_prints_the_formulas() -> None:
    alone = run("--explain")
    assert alone.exit_code == 0
    assert "sqrt(2 C M)" in alone.stdout and "tau >= (1 - f) P" in alone.stdout
    with_result = run("--ckpt-time", "140s", "--mtbf", "3h", "--explain")
    assert "Young" in with_result.stdout and "Daly (2006)" in with_result.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        # each message names the flag and the value, and says what is wrong with it
        (["--ckpt-time", "-5m", "--mtbf", "3h"], ("'--ckpt-time'", "'-5m'", "not a duration")),
        (["--ckpt-time", "0s", "--mtbf", "3h"], ("'--ckpt-time'", "'0s'", "must be positive")),
        (["--ckpt-time", "140s", "--mtbf", "3 fortnights"], ("'--mtbf'", "'3 fortnights'", "not a duration")),
        (["--size", "lots", "--bandwidth", "1GB/s"], ("'--size'", "'lots'", "not a size")),
        (["--size", "140GB", "--bandwidth", "fast"], ("'--bandwidth'", "'fast'", "not a rate")),
        (["--params", "0", "--bandwidth", "1GB/s"], ("'--params'", "'0'", "must be positive")),
        (["--ckpt-time", "140s", "--gpus", "0", "--gpu-mtbf", "50000h"], ("'--gpus'", "'0'", "positive whole number")),
        (["--ckpt-time", "140s", "--failures", "nosuch"], ("failure preset 'nosuch'", "llama3")),
        (["--model", "llama3-9b", "--bandwidth", "1GB/s"], ("model preset 'llama3-9b'", "llama3-8b")),
        (["--ckpt-time", "140s", "--size", "140GB", "--bandwidth", "1GB/s"], ("--ckpt-time and --size",)),
        (["--ckpt-time", "140s", "--mtbf", "3h", "--failures", "llama3"], ("--mtbf and --failures",)),
        (["--params", "70B", "--model", "llama3-70b", "--bandwidth", "1GB/s"], ("--params and --model",)),
        (["--params", "70B", "--bandwidth", "1GB/s", "--weights-only", "--optimizer", "adam"],
         ("--weights-only and --optimizer",)),
        (["--stall", "1s", "--ckpt-time", "60s", "--persist", "60s"], ("--persist and --ckpt-time",)),
        (["--ckpt-time", "60s", "--persist", "60s"], ("--persist", "add --stall")),
        (["--size", "140GB"], ("--size needs --bandwidth",)),
        (["--ckpt-time", "60s", "--gpu-mtbf", "50000h"], ("--gpu-mtbf needs --gpus",)),
        (["--ckpt-time", "60s", "--mtbf", "3h", "--gpus", "8"], ("--gpus 8",)),
        (["--ckpt-time", "60s", "--dtype", "fp8"], ("--dtype applies only with --params or --model",)),
        (["--ckpt-time", "4h", "--mtbf", "3h"], ("cannot keep up", "4h", "3h")),
        (["--stall", "1s", "--persist", "30m", "--mtbf", "3h", "--every", "10m"],
         ("interval 10m", "two checkpoints in flight", "30m")),
        (["--ckpt-time", "60s", "--plot", "x.png"], ("--plot needs a failure rate",)),
        (["--ckpt-time", "60s", "--mtbf", "3h", "--interference", "1.5"], ("'--interference'", "'1.5'")),
        ([], ("give the checkpoint cost",)),
        (["--ckpt-time", "60s", "--mtbf", "3h", "--seed", "1"], ("--seed applies only with --simulate",)),
        (["--ckpt-time", "60s", "--mtbf", "3h", "--weibull-shape", "0.7"], ("--weibull-shape applies only",)),
        (["--ckpt-time", "60s", "--simulate", "100"], ("--simulate needs a failure rate",)),
        (["--ckpt-time", "60s", "--mtbf", "3h", "--simulate", "100", "--weibull-shape", "-1"],
         ("'--weibull-shape'", "'-1'", "positive")),
        # review findings 1-7
        (["--ckpt-time", "140s", "--mtbf", "3h", "--simulate", "1", "--json"], ("--simulate 1", "runs must be >= 2")),
        (["--ckpt-time", "1s", "--mtbf", "1m", "--restart", "12h"],
         ("restart 12h", "720 times the MTBF (1m)", "never completes")),
        (["--ckpt-time", "1s", "--mtbf", "1h", "--every", "1000h"],
         ("interval 41d 16h", "1,000 times the MTBF (1h)", "never completes", "checkpoint more often")),
        (["--ckpt-time", "2h", "--mtbf", "3h", "--restart", "2h", "--simulate", "100000", "--work", "300d"],
         ("100,000 simulated runs of 300d", "fewer runs (--simulate)", "shorter run (--work)")),
        (["--params", "1e-3", "--bandwidth", "1GB/s", "--mtbf", "3h"], ("parameter count 0.001", "0 bytes")),
        (["--ckpt-time", "140s", "--mtbf", "1e400s"], ("'--mtbf'", "'1e400s'", "must be finite")),
        (["--ckpt-time", "140s", "--mtbf", "1e308d"], ("'--mtbf'", "'1e308d'", "must be finite")),
        (["--params", "1e400", "--bandwidth", "1GB/s"], ("'--params'", "'1e400'", "must be finite")),
        (["--size", "1e400GB", "--bandwidth", "1GB/s"], ("'--size'", "'1e400GB'", "must be finite")),
        (["--ckpt-time", "140s", "--faults-per-day", "-1"], ("'--faults-per-day'", "'-1'", "positive number")),
        # durations the models can compute with: 1 ns to 1e18 s, given or derived
        (["--ckpt-time", "1e-320s", "--mtbf", "3h"], ("'--ckpt-time'", "'1e-320s'", "between 1 ns and 1e+18 s")),
        (["--size", "140GB", "--bandwidth", "1e-300B/s", "--mtbf", "3h"], ("--size gives 1.4e+11 bytes", "1e-300")),
        (["--ckpt-time", "140s", "--faults-per-day", "1e300"], ("--faults-per-day 1e+300", "job MTBF of 8.64e-296 s")),
        # counts past 10^8 used to overflow a float: a traceback
        (["--ckpt-time", "1s", "--gpu-mtbf", "50000h", "--gpus", "1" + "0" * 400],
         ("'--gpus'", "is more than 100,000,000 GPUs")),
        (["--ckpt-time", "1s", "--failures", "llama3", "--gpus", "1" + "0" * 400], ("'--gpus'", "100,000,000 GPUs")),
        (["--ckpt-time", "1s", "--node-mtbf", "5000h", "--nodes", "1" + "0" * 400],
         ("'--nodes'", "is more than 100,000,000 nodes")),
        (["--ckpt-time", "1s", "--mtbf", "3h", "--simulate", "1" + "0" * 400],
         ("simulated runs about 10^400 is more than 100,000,000",)),
        # a Weibull shape whose scale overflows (Gamma(1 + 1/k)): a traceback
        (["--ckpt-time", "140s", "--mtbf", "3h", "--simulate", "1000", "--weibull-shape", "0.001"],
         ("Weibull shape 0.001 is below 0.1", "use a shape of at least 0.1")),
        (["--ckpt-time", "140s", "--mtbf", "3h", "--restart", "-1s"], ("'--restart'", "'-1s'", "not a duration")),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_it(args: list[str], named: tuple[str, ...]) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    for fragment in named:
        assert fragment in lines[0]
    assert "try 4000, 8B" not in lines[0]  # a count's suggestions belong to counts only
    assert result.stdout == ""


def test_a_restart_of_zero_is_allowed_as_its_default_is() -> None:
    # --restart 0 was refused ("duration '0' must be positive") although its help says [default: 0].
    doc = run_json("--ckpt-time", "140s", "--mtbf", "3h", "--restart", "0")
    assert doc["restart_s"] == 0
    assert doc == run_json("--ckpt-time", "140s", "--mtbf", "3h") | {"notes": doc["notes"]}
    assert not any("no --restart given" in n for n in doc["notes"])
    human = run("--ckpt-time", "140s", "--mtbf", "3h", "--restart", "0s")
    assert human.exit_code == 0 and "0 (not given)" not in human.stdout


def test_simulating_work_shorter_than_the_persist_time() -> None:
    # 30 min of work, a 1 h persist: one interval, one checkpoint; it was refused as "two in flight".
    doc = run_json("--stall", "1s", "--persist", "1h", "--mtbf", "1d", "--simulate", "100", "--work", "30m",
                   "--interference", "0")
    sim = doc["simulation"]["at_optimum"]
    assert sim["interval_s"] == 1800 and doc["optimal_interval_s"] == 3600
    assert sim["model_wall_s"] > 1800 + 1 + 3600


def test_notes_flag_an_interval_shorter_than_the_checkpoint_and_a_restart_longer_than_the_mtbf() -> None:
    short = run_json("--ckpt-time", "140s", "--mtbf", "3h", "--every", "1s")
    assert any("--every 1 s is shorter than the checkpoint itself" in n and "14000 %" in n for n in short["notes"])
    without_rate = run_json("--ckpt-time", "140s", "--every", "1s")
    assert any("shorter than the checkpoint itself" in n for n in without_rate["notes"])
    slow_restart = run_json("--ckpt-time", "140s", "--mtbf", "3h", "--restart", "10h")
    assert any("--restart 10h is longer than the MTBF (3h)" in n for n in slow_restart["notes"])
    human = run("--ckpt-time", "140s", "--mtbf", "3h", "--restart", "10h")
    assert "longer than the MTBF" in human.stdout
    usual = run_json("--ckpt-time", "140s", "--mtbf", "3h", "--restart", "10m", "--every", "1h")
    assert not any("shorter than the checkpoint" in n or "longer than the MTBF" in n for n in usual["notes"])


def test_simulate_builds_every_configuration_before_running_any(monkeypatch) -> None:
    # At the optimum the run fits the budget; at --every (much longer intervals) it does not: nothing runs.
    from ckptbench.model import simulate as simulate_module

    ran: list[object] = []
    monkeypatch.setattr(simulate_module, "simulate", lambda config: ran.append(config))
    result = run("--ckpt-time", "140s", "--mtbf", "3h", "--restart", "10m", "--every", "10h",
                 "--simulate", "20000", "--work", "300d")
    assert result.exit_code == 2, result.stdout
    assert "fewer runs (--simulate)" in result.stderr
    assert ran == []


def test_plot_into_a_missing_directory_fails_before_computing(tmp_path: Path) -> None:
    result = run("--ckpt-time", "60s", "--mtbf", "3h", "--plot", str(tmp_path / "no" / "x.png"))
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_the_command_imports_neither_torch_nor_matplotlib() -> None:
    code = (
        "import sys\n"
        "from ckptbench.cli import main\n"
        "try:\n"
        "    main(['interval', '--params', '70B', '--bandwidth', '1GB/s', '--mtbf', '3h', '--every', '1h', '--json'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "heavy = [m for m in ('torch', 'matplotlib', 'scipy', 'numpy') if m in sys.modules]\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stderr
    assert json.loads(proc.stdout)["young_interval_s"] > 0


def test_defaults_from_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "ckptbench.toml"
    config.write_text('[interval]\nckpt-time = "5m"\nmtbf = "24h"\nrestart = "10m"\n')
    result = CliRunner().invoke(main, ["--config", str(config), "interval", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["young_interval_s"] == pytest.approx(7200)
    assert doc["restart_s"] == 600

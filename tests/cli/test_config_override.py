"""A flag on the command line overrides the ``--config`` value it competes with (the failure rate, the
model size, the checkpoint cost), as the config files promise; two such flags typed together are still
refused with one line, exit 2."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN_CONFIG = REPO / "configs/runs/llama3-70b-512gpu.toml"
GOODPUT = ["--tokens", "1T", "--gpus", "64", "--peak-tflops", "989", "--mfu", "0.4", "--detect", "1m",
           "--replace", "1m", "--resume", "1m"]


@pytest.fixture
def config(tmp_path: Path):
    def write(text: str) -> str:
        path = tmp_path / "ckptbench.toml"
        path.write_text(text)
        return str(path)

    return write


def test_preflight_flags_override_the_run_config(cli, tmp_path: Path, caplog, monkeypatch):
    from ckptbench import knobs

    monkeypatch.setattr(knobs, "SAMPLE_RANKS_MAX", 1)  # one writer measures the sample: the job is the point here
    with caplog.at_level(logging.INFO, logger="ckptbench.cli"):
        result = cli("--config", str(RUN_CONFIG), "preflight", str(tmp_path), "--mtbf", "3h", "--params", "7B",
                     "--measure-size", "24MiB", "--measure-time", "0", "--repeat", "1", "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == (1 if doc["verdict"] == "FAIL" else 0), result.stderr
    job = doc["job"]
    assert job["failures"] == {"mtbf_s": 10800, "source": "--mtbf 3h"}
    assert job["model"] == "7e+09 params" and job["ranks"] == 512  # the rest of the config still applies
    assert "failures = 'llama3' from --config is dropped: --mtbf on the command line overrides it" in caplog.text
    assert "model = 'llama3-70b' from --config is dropped" in caplog.text


def test_interval_flags_override_the_config_and_what_serves_it(cli, config):
    path = config('[interval]\nparams = "10B"\nbandwidth = "1GB/s"\ndtype = "fp32"\nfailures = "llama3"\n'
                  'gpus = 16384\n')
    doc = cli.json("--config", path, "interval", "--ckpt-time", "5m", "--mtbf", "24h")
    assert (doc["checkpoint_s"], doc["checkpoint_bytes"], doc["mtbf_s"]) == (300, None, 86400)
    doc = cli.json("--config", path, "interval", "--gpu-mtbf", "50000h")  # --gpus from the config still serves it
    assert doc["mtbf_s"] == pytest.approx(50000 * 3600 / 16384)
    assert doc["checkpoint_s"] == pytest.approx(10e9 * 12 / 1e9)  # fp32 weights + Adam, at 1 GB/s


def test_goodput_flags_override_the_config(cli, config):
    path = config('[goodput]\nparams = "100B"\nfaults-per-day = 1\npersist = "60s"\n')
    doc = cli.json("--config", path, "goodput", *GOODPUT, "--model", "llama3-8b", "--mtbf", "1d",
                   "--ckpt-time", "30s", "--ckpt-interval", "30m")
    assert doc["params"] < 1e10 and doc["failure_source"] == "--mtbf 1d" and doc["checkpoint_s"] == 30


@pytest.mark.parametrize(("command", "args", "needle"), [
    ("preflight", ["--mtbf", "3h", "--faults-per-day", "2"], "--mtbf and --faults-per-day both give the failure rate"),
    ("preflight", ["--model", "llama3-8b", "--params", "7B"], "--model and --params both give the model size"),
    ("interval", ["--ckpt-time", "5m", "--mtbf", "3h", "--failures", "llama3"], "both give the failure rate"),
    ("goodput", [*GOODPUT, "--params", "7B", "--model", "llama3-8b", "--mtbf", "1d"], "both give the parameter count"),
])
def test_two_flags_on_the_command_line_are_still_refused(cli, config, tmp_path: Path, command, args, needle):
    path = config(f'[{command}]\nfailures = "llama3"\n')
    result = cli("--config", path, command, *([str(tmp_path)] if command == "preflight" else []), *args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr


def test_two_competing_values_in_the_config_are_refused(cli, config):
    path = config('[interval]\nckpt-time = "5m"\nmtbf = "3h"\nfailures = "llama3"\n')
    result = cli("--config", path, "interval")
    assert result.exit_code == 2 and "--mtbf and --failures both give the failure rate" in result.stderr

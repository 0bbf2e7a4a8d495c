"""``preflight --device cuda`` and the distributed bench with each rank's state on its GPU.

Run on a machine with a GPU: ``pytest -m gpu tests/gpu``. Without one every test skips with the reason.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

TINY = ["--measure-size", "24MiB", "--repeat", "2", "--measure-time", "0", "--mtbf", "1d", "--max-ckpt-time", "60s"]
LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), "-m", "ckptbench", *args]
    return subprocess.run(cmd, cwd=cwd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)


def test_preflight_on_the_gpu_measures_the_interference_there(cli, tmp_path: Path):
    target = tmp_path / "t"
    target.mkdir()
    result = cli("preflight", str(target), *TINY, "--params", "100M", "--ranks", "1", "--device", "cuda", "--json")
    assert result.exit_code in (0, 3), result.stderr
    doc = json.loads(result.stdout)
    m, p = doc["measurements"], doc["predictions"]
    assert m["device"] == "cuda" and m["checkpoint_bench"]["spec"]["device"] == "cuda"
    # the compute probe ran on the GPU and its slowdown is the interference used, with the runs' range
    assert m["checkpoint_bench"]["probe"]["device"].startswith("cuda")
    assert m["probe_interference"] is None and m["interference"] is not None
    low, high = m["interference_range"]
    assert low <= m["interference"] <= high < 1
    assert p["interference"] == m["interference"] and "training device (cuda)" in p["interference_source"]
    assert p["interference_range"] == [low, high]
    assert list(target.iterdir()) == []


def test_preflight_console_names_the_device(cli, tmp_path: Path):
    target = tmp_path / "t"
    target.mkdir()
    result = cli("preflight", str(target), *TINY, "--params", "100M", "--ranks", "1", "--device", "cuda")
    assert result.exit_code in (0, 3), result.stderr
    assert "the state_dict on cuda" in result.stdout and "training device (cuda)" in result.stdout


def test_distributed_bench_stages_each_ranks_gpu_state(tmp_path: Path):
    target = tmp_path / "t"
    target.mkdir()
    proc = _torchrun(["bench", str(target), "--workload", "checkpoint", "--size", "64MiB", "--repeat", "1",
                      "--warmup", "0", "--device", "cuda", "--json"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    assert doc["spec"]["device"] == "cuda" and doc["launch"]["world_size"] == 2
    assert all(r["duration_s"] > 0 for r in doc["rounds"]["save"] + doc["rounds"]["load"])


def test_preflight_under_torchrun_on_the_gpus(tmp_path: Path):
    target = tmp_path / "t"
    target.mkdir()
    proc = _torchrun(["preflight", str(target), "--params", "20M", "--ranks", "2", "--gpus-per-node", "2",
                      "--mtbf", "1d", "--repeat", "2", "--device", "cuda", "--json"], cwd=tmp_path)
    assert proc.returncode in (0, 3), proc.stdout[-2000:] + proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    assert doc["measurements"]["shape"] == "job" and doc["measurements"]["device"] == "cuda"


def test_compare_on_the_gpu_uses_each_tiers_measured_interference(cli, tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    doc = cli.json("compare", str(a), str(b), "--size", "32MiB", "--repeat", "2", "--warmup", "0", "--mtbf", "1d",
                   "--device", "cuda")
    assert doc["spec"]["device"] == "cuda" and doc["job"]["interference_measured"] is True
    from ckptbench.model.interference import from_slowdown

    for tier in doc["tiers"]:
        slowdown = tier["measured"]["interference"]
        expected = from_slowdown(slowdown) if slowdown is not None else doc["job"]["interference"]
        assert tier["model"]["interference"] == pytest.approx(expected)

"""``ckptbench recommend``: settings from saved results (the reference runs in results/, read only) or a
fresh sweep, as TOML that parses and as arguments; bad files exit 2 with one line."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FS = REPO / "results" / "bench-vm-20261126T042848.json"
CKPT = REPO / "results" / "bench-checkpoint-vm-20261126T055124.json"


def test_from_saved_results(cli):
    doc = cli.json("recommend", str(FS), str(CKPT), "--ckpt-size", "140GB", "--mtbf", "6h")
    fs = json.loads(FS.read_text())
    best = fs["results"][fs["best"]]["config"]
    settings = doc["settings"]
    assert settings["block_size_bytes"]["value"] == best["block_size"]
    assert settings["threads"]["value"] == json.loads(CKPT.read_text())["results"][0]["details"]["threads"]  # later wins
    assert str(CKPT) in settings["threads"]["reason"]
    assert settings["interval_s"]["value"] > 0 and "exact optimum" in settings["interval_s"]["reason"]
    toml = tomllib.loads(doc["toml"])
    assert toml["checkpoint"]["threads"] == settings["threads"]["value"]
    assert "interval" in toml["schedule"]
    assert any(line.startswith("ckptbench.save(state_dict, path, threads=") for line in doc["code"])
    assert any("FileSystemWriter(path, thread_count=" in line for line in doc["code"])


def test_fresh_sweep_when_no_files(cli, tmp_path: Path):
    result = cli("recommend", "--target", str(tmp_path), "--size", "8MiB")
    assert result.exit_code == 0, result.stderr
    assert "a fresh sweep of" in result.stdout and "[checkpoint]" in result.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("content", "needle"), [
    (None, "does not exist"),
    ("{nope", "is not JSON"),
    ('{"a": 1}', "not a ckptbench result"),
    ('{"schema": "ckptbench.bench.fs/2"}', "version this ckptbench does not read"),
    ('{"schema": "someone.else/1"}', "unknown result schema"),
])
def test_bad_result_files(cli, tmp_path: Path, content, needle):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    result = cli("recommend", str(FS), str(path))
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and needle in result.stderr


def test_interval_needs_size_and_rate(cli):
    result = cli("recommend", str(FS), "--ckpt-size", "10GB")
    assert result.exit_code == 2 and "go together" in result.stderr
    result = cli("recommend", str(FS), "--target", "/tmp")
    assert result.exit_code == 2 and "fresh sweep" in result.stderr

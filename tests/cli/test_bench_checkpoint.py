"""``ckptbench bench --workload checkpoint`` end to end on small state_dicts: JSON shape, every writer,
verification, output files, cleanup, bad input. Never asserts timings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckptbench import native

QUICK = ["--workload", "checkpoint", "--repeat", "1", "--warmup", "0"]
ALL_WRITERS = ["ckptbench", "torch", "dcp", "safetensors"] + (["fio"] if shutil.which("fio") else [])


def test_every_writer_saved_loaded_and_verified(cli, tmp_path: Path):
    pytest.importorskip("safetensors")
    keep = tmp_path / "precious.bin"
    keep.write_bytes(b"keep me")
    doc = cli.json("bench", str(tmp_path), *QUICK, "--size", "8MiB", "--writers", ",".join(ALL_WRITERS))
    assert doc["schema"] == "ckptbench.bench.checkpoint/1"
    assert doc["spec"]["workload"] == "checkpoint" and doc["spec"]["writers"] == ALL_WRITERS
    assert doc["units"]["gbps"].startswith("1e9 bytes per second")
    workload = doc["workload"]
    assert workload["model"] == "llama3-8b" and workload["requested_bytes"] == 8 * 2**20
    assert set(workload["bytes_by_dtype"]) == {"bf16", "fp32"} and workload["tensors"] > 20
    assert [r["writer"] for r in doc["results"]] == ALL_WRITERS
    for r in doc["results"]:
        for op in ("save", "load"):
            assert len(r[op]["runs_s"]) == 1 and r[op]["gbps"] > 0 and r[op]["bytes_per_run"] > 0
            assert r[op]["cached"] in (True, False)
        assert r["verified"] is (None if r["writer"] == "fio" else True)
        assert r["files"] >= 1 and r["disk_bytes"] > 0 and r["durable"] and r["load_how"]
    ours = doc["results"][0]
    assert ours["details"]["threads"] >= 1 and ours["details"]["checksum"] is True
    assert isinstance(ours["details"]["plan_reused"], bool)
    cow = native.cow_unavailable()  # async saves staged copy-on-write where the machine allows it
    assert ours["details"]["async_staging"] == ("copy" if cow else "copy-on-write")
    assert ours["details"]["async_cow_unavailable"] == (cow or None) and ours["details"]["async_cow_faults"] >= 0
    assert doc["data_verified"] is True
    assert [a["writer"] for a in doc["async"]] == ["ckptbench", "dcp"]
    for a in doc["async"]:
        assert a["verified"] is True and a["stall_s"] > 0 and a["persist_s"] > 0
        assert a["total_s"] == pytest.approx(a["stall_s"] + a["persist_s"])
        assert len(a["runs_interference"]) == 1
    assert doc["probe"]["kind"] and doc["probe"]["products_per_step"] >= 1 and doc["probe"]["device"] == "cpu"
    memory = doc["memory"]
    assert memory["saves"] == 10 and len(memory["rss_after_bytes"]) == 10
    assert memory["checkpoint_bytes"] == workload["total_bytes"]
    goals = {g["name"] for g in doc["goals"]}
    assert {"save_vs_torch", "save_vs_dcp", "load_vs_torch", "async_stall_vs_dcp", "async_total_vs_sync",
            "peak_extra_rss_vs_checkpoint", "rss_growth_vs_checkpoint"} <= goals
    assert doc["cache_drop"]["method"] in ("drop_caches", "fadvise")
    assert doc["environment"]["target"]["filesystem"]
    assert all(w["remedy"] for w in doc["warnings"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.bin"]  # scratch removed, nothing else touched
    assert keep.read_bytes() == b"keep me"


def test_table_plot_and_output_file(cli, tmp_path: Path):
    target, out = tmp_path / "t", tmp_path / "results"
    target.mkdir()
    png = tmp_path / "shootout.png"
    result = cli("bench", str(target), *QUICK, "--model", "llama3-70b", "--scale", "0.0001", "--writers",
                 "ckptbench,torch", "--plot", str(png), "--output", str(out))
    assert result.exit_code == 0, result.stderr
    for needle in ("llama3-70b", "save GB/s", "load GB/s", "async saves", "stall", "memory:", "ckptbench durable save GB/s / torch durable save GB/s: ",
                   "durable:", "ckptbench async staging: "):
        assert needle in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    files = list(out.glob("bench-checkpoint-*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    assert doc["workload"]["model"] == "llama3-70b" and doc["spec"]["scale"] == 0.0001
    assert [r["writer"] for r in doc["results"]] == ["ckptbench", "torch"] and [a["writer"] for a in doc["async"]] == [
        "ckptbench"]
    assert list(target.iterdir()) == []
    # the file as the user can use it: relative under the working directory, absolute elsewhere (no ../..)
    [shown] = [line.removeprefix("result: ") for line in result.stdout.splitlines() if line.startswith("result: ")]
    assert Path(shown).resolve() == files[0].resolve() and not shown.startswith("..")


def test_default_writer_is_ckptbench_and_threads_are_passed(cli, tmp_path: Path):
    doc = cli.json("bench", str(tmp_path), *QUICK, "--size", "4MiB", "--threads", "1")
    assert [r["writer"] for r in doc["results"]] == ["ckptbench"]
    assert doc["results"][0]["details"]["threads"] == 1 and doc["spec"]["threads"] == 1
    assert "few-repeats" in {w["code"] for w in doc["warnings"]}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--workload", "checkpoint", "--writers", "ckptbench,nope"], "'nope' is not one of"),
        (["--workload", "checkpoint", "--model", "gpt-17"], "unknown model preset 'gpt-17'"),
        (["--workload", "checkpoint", "--scale", "0"], "(0, 1]"),
        (["--workload", "checkpoint", "--scale", "1.5"], "(0, 1]"),
        (["--workload", "checkpoint", "--scale", "lots"], "not a fraction"),
        (["--workload", "checkpoint", "--scale", "0.1", "--size", "1GiB"], "not both"),
        (["--workload", "checkpoint", "--files", "4"], "--files applies to --workload fs only"),
        (["--workload", "checkpoint", "--threads", "1,2"], "one value"),
        (["--workload", "checkpoint", "--writers", "torch,torch"], "twice"),
        (["--workload", "checkpoint", "--size", "64KiB"], "below the smallest"),
        (["--workload", "checkpoint", "--size", "1PiB"], "more than the full llama3-8b workload"),
        (["--workload", "checkpoint", "--model", "llama3-405b", "--scale", "0.5"], "available"),
        (["--workload", "nope"], "'nope' is not one of"),
        (["--writers", "ckptbench,torch"], "--writers applies to --workload checkpoint only"),
        (["--scale", "0.1"], "--scale applies to --workload checkpoint only"),
        (["--model", "llama3-8b"], "--model applies to --workload checkpoint only"),
        (["--device", "cpu"], "--device applies to --workload checkpoint only"),
        (["--workload", "checkpoint", "--device", "tpu"], "must be cpu, cuda or cuda:N"),
        (["--workload", "checkpoint", "--device", "cuda:x"], "must be cpu, cuda or cuda:N"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(cli, tmp_path: Path, args, needle):
    target = tmp_path / "target"
    target.mkdir()
    result = cli("bench", str(target), *args)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptbench: error:"), result.stderr
    assert needle in lines[0]
    assert list(target.iterdir()) == []


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_one_line_before_anything_runs(cli, tmp_path: Path):
    result = cli("bench", str(tmp_path), *QUICK, "--size", "4MiB", "--device", "cuda")
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda needs a CUDA GPU" in lines[0], lines
    assert "torch.cuda.is_available() is False" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_the_device_is_recorded_and_shown(cli, tmp_path: Path):
    doc = cli.json("bench", str(tmp_path), *QUICK, "--size", "4MiB", "--device", "cpu")
    assert doc["spec"]["device"] == "cpu"
    result = cli("bench", str(tmp_path), *QUICK, "--size", "4MiB")
    assert result.exit_code == 0 and "state_dict on cpu" in result.stdout


def test_missing_target_is_exit_2(cli, tmp_path: Path):
    result = cli("bench", str(tmp_path / "missing"), "--workload", "checkpoint", "--scale", "0.001")
    assert result.exit_code == 2 and "does not exist" in result.stderr

"""``ckptbench bench`` end to end on small sizes: JSON shape, output files, cleanup, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SMALL = ["--size", "8MiB", "--files", "2", "--threads", "1,2", "--block-size", "1MiB", "--repeat", "2",
         "--warmup", "0"]


def test_json_document_shape(cli, tmp_path: Path):
    doc = cli.json("bench", str(tmp_path), *SMALL)
    assert doc["schema"] == "ckptbench.bench.fs/1"
    assert doc["units"]["gbps"] == "1e9 bytes per second"
    assert len(doc["results"]) == 2
    for record, threads in zip(doc["results"], (1, 2), strict=True):
        config = record["config"]
        assert config["threads"] == threads and config["block_size"] == 2**20
        assert config["size_bytes"] == 8 * 2**20 and config["files"] == 2
        assert config["direct"] is True and config["fsync"] is True and config["sync"] == "fdatasync"
        assert config["schedule"] == "shared"
        for op in ("write", "read"):
            phase = record[op]
            assert len(phase["runs_gbps"]) == 2 and all(v > 0 for v in phase["runs_gbps"])
            assert phase["gbps"] == pytest.approx(sorted(phase["runs_gbps"])[0] / 2 + sorted(phase["runs_gbps"])[1] / 2)
            assert phase["bytes_per_run"] == 8 * 2**20
            assert set(phase["latency_ms"]) >= {"p50", "p90", "p99", "max"}
            assert phase["cached"] in (True, False)
    assert 0 <= doc["best"] < 2
    assert doc["data_verified"] is True
    env = doc["environment"]
    assert env["target"]["filesystem"] and env["cpu_count"] >= 1 and env["memory_bytes"] > 0
    assert env["tool_version"]
    assert doc["memcpy_gbps"] > 0
    assert list(tmp_path.iterdir()) == []  # scratch removed


def test_buffered_without_fsync_is_flagged(cli, tmp_path: Path):
    doc = cli.json("bench", str(tmp_path), "--size", "4MiB", "--files", "1", "--threads", "1", "--buffered",
                   "--no-fsync", "--no-read", "--repeat", "1", "--warmup", "0")
    record = doc["results"][0]
    assert record["config"]["direct"] is False and record["config"]["fsync"] is False
    assert record["read"] is None
    codes = {w["code"] for w in doc["warnings"]}
    assert {"not-durable", "few-repeats"} <= codes
    assert all(w["remedy"] for w in doc["warnings"])


def test_table_output_and_output_dir(cli, tmp_path: Path, monkeypatch):
    from ckptbench import knobs

    monkeypatch.setattr(knobs, "METADATA_FILES", 200)  # the metadata rounds' shape, not their 2000 files
    target, out = tmp_path / "t", tmp_path / "results"
    target.mkdir()
    result = cli("bench", str(target), *SMALL, "--metadata", "--output", str(out))
    assert result.exit_code == 0, result.stderr
    assert "write GB/s" in result.stdout and "files/s" in result.stdout
    assert ("best:" in result.stdout) != ("tied (no one beyond the noise" in result.stdout)
    assert "fastest median:" in result.stdout
    files = list(out.glob("bench-*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    assert len(doc["metadata"]) == 2 and doc["metadata"][0]["ops_per_s"] > 0
    assert list(target.iterdir()) == []


def test_plot_is_a_png(cli, tmp_path: Path):
    target = tmp_path / "t"
    target.mkdir()
    png = tmp_path / "sweep.png"
    result = cli("bench", str(target), *SMALL, "--plot", str(png))
    assert result.exit_code == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = cli("bench", str(target), *SMALL, "--plot", str(tmp_path / "no" / "x.png"))
    assert bad.exit_code == 2 and "does not exist" in bad.stderr


def test_existing_files_are_untouched(cli, tmp_path: Path):
    keep = tmp_path / "precious.bin"
    keep.write_bytes(b"keep me")
    assert cli("bench", str(tmp_path), *SMALL).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.bin"]
    assert keep.read_bytes() == b"keep me"


def test_direct_fallback_is_reported(cli, mount_fs):
    where = mount_fs("ramfs")
    doc = cli.json("bench", str(where), "--size", "4MiB", "--files", "1", "--threads", "1", "--repeat", "1",
                   "--warmup", "0")
    config = doc["results"][0]["config"]
    assert config["direct_requested"] is True and config["direct"] is False
    assert config["sync"] == "fdatasync" and "O_DIRECT" in config["direct_fallback_reason"]
    assert {"direct-fallback", "memory-filesystem"} <= {w["code"] for w in doc["warnings"]}


def test_target_defaults_to_the_temp_directory(cli, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    doc = cli.json("bench", "--size", "4MiB", "--files", "1", "--threads", "1", "--repeat", "1", "--warmup", "0")
    assert doc["target"] == str(tmp_path)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["{missing}"], "does not exist"),
        (["{file}"], "is a file"),
        (["{dir}", "--size", "0"], "must be positive"),
        (["{dir}", "--size", "lots"], "not a size"),
        (["{dir}", "--size", "-5GB"], "size"),
        (["{dir}", "--threads", "0"], "positive whole number"),
        (["{dir}", "--threads", "1,x"], "not a whole number"),
        (["{dir}", "--block-size", "1000"], "multiple of 4 KiB"),
        (["{dir}", "--files", "2", "--file-size", "1MiB"], "not both"),
        (["{dir}", "--repeat", "0"], "positive"),
        (["s3://"], "names no bucket"),
        (["s3://Bad_Bucket/x"], "not a valid bucket name"),
        (["ftp2://x"], "unknown storage protocol"),
        (["{dir}", "--storage-option", "part_size=8MiB"], "apply to object storage"),
        (["s3://bucket/x", "--storage-option", "part_size"], "KEY=VALUE"),
        (["s3://bucket/x", "--storage-option", "colour=blue", "--endpoint-url", "http://127.0.0.1:1"],
         "unknown storage option"),
        (["s3://bucket/x", "--endpoint-url", "ftp://nowhere"], "not an http"),
        (["s3://bucket/x", "--files", "3"], "applies to filesystem targets"),
        (["{dir}", "--size", "1PiB"], "free"),
        (["{dir}", "--size", "1.5"], "'1.5' is not a whole number of bytes; did you mean 1.5GiB?"),
        (["{dir}", "--size", "1Gb"], "'1Gb' is in bits; sizes are in bytes (B, not b): write 1GB or 1GiB"),
        (["{dir}", "--block-size", "1MiB,4Mb"], "'4Mb' is in bits"),
        (["{dir}", "--workload", "checkpoint", "--size", "64Mb"], "'64Mb' is in bits"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(cli, tmp_path: Path, args, needle):
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "plain.txt").write_text("x")
    subs = {"{missing}": str(tmp_path / "missing"), "{file}": str(tmp_path / "plain.txt"), "{dir}": str(target)}
    result = cli("bench", *[subs.get(a, a) for a in args])
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptbench: error:"), result.stderr
    assert needle in lines[0]
    assert "Traceback" not in result.stderr
    assert list(target.iterdir()) == []


def test_schedule_sweep(cli, tmp_path: Path):
    doc = cli.json("bench", str(tmp_path), "--size", "4MiB", "--files", "2", "--threads", "2", "--schedule",
                   "shared,per-file", "--repeat", "1", "--warmup", "0")
    assert [r["config"]["schedule"] for r in doc["results"]] == ["shared", "per-file"]
    bad = cli("bench", str(tmp_path), "--schedule", "random")
    assert bad.exit_code == 2 and "random" in bad.stderr


def test_buffered_accepts_any_block_size(cli, tmp_path: Path):
    doc = cli.json("bench", str(tmp_path), "--size", "1MB", "--files", "1", "--threads", "1", "--block-size",
                   "100000", "--buffered", "--repeat", "1", "--warmup", "0")
    assert doc["results"][0]["config"]["block_size"] == 100000


@pytest.mark.parametrize(("args", "needle"), [
    (["--size", "16MiB", "--block-size", "1MiB,64MiB,1TiB"],
     "block size 64 MiB is larger than the files, 2 MiB each (--size 16 MiB over 8 files)"),
    (["--size", "16MiB", "--file-size", "4MiB", "--block-size", "8MiB", "--buffered"], "use --block-size 4MiB or less"),
    (["--size", "1GiB", "--files", "1", "--block-size", "512MiB"], "larger than the 256 MiB buffer"),
])
def test_a_block_size_larger_than_any_io_is_refused_before_running(cli, tmp_path: Path, args, needle):
    result = cli("bench", str(tmp_path), "--threads", "1", "--repeat", "1", *args)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


def test_the_default_block_size_shrinks_to_small_files(cli, tmp_path: Path):
    doc = cli.json("bench", str(tmp_path), "--size", "4MiB", "--files", "2", "--threads", "1", "--repeat", "1",
                   "--warmup", "0")
    assert [r["config"]["block_size"] for r in doc["results"]] == [2 * 2**20]  # what the engine issued, not 4 MiB


@pytest.mark.parametrize(("url", "needle"), [
    ("ftp://127.0.0.1:1/ckpt", "Connection refused"),  # the host and port come from the URL: nothing listens there
    ("ftp://127.0.0.1:x/ckpt", "Port could not be cast"),
])
def test_a_url_carries_its_storage_options_and_a_failed_open_is_one_line(cli, url, needle):
    result = cli("bench", url, "--workload", "checkpoint")
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "ftp:// filesystem cannot be opened" in lines[0] and needle in lines[0], result.stderr


def test_unwritable_target(cli, mount_fs):
    where = mount_fs("tmpfs", "size=4m,ro")
    result = cli("bench", str(where), *SMALL)
    assert result.exit_code == 2 and "not writable" in result.stderr


def test_config_file_feeds_defaults(cli, tmp_path: Path):
    config = tmp_path / "c.toml"
    config.write_text('[bench]\nsize = "4MiB"\nfiles = 1\nthreads = [2]\nblock-size = "512KiB"\nrepeat = 1\nwarmup = 0\n')
    target = tmp_path / "t"
    target.mkdir()
    result = cli("--config", str(config), "bench", str(target), "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)["results"][0]
    assert record["config"]["threads"] == 2 and record["config"]["block_size"] == 512 * 1024
    # flags still win over the file
    result = cli("--config", str(config), "bench", str(target), "--threads", "1", "--json")
    assert json.loads(result.stdout)["results"][0]["config"]["threads"] == 1


@pytest.mark.parametrize(
    ("text", "needle"),
    [('[bench]\nthreads = "0"\n', "positive"), ("[bench]\nsize = 1.5\n", "not a whole number of bytes"),
     ('[bench]\nsize = "8Gb"\n', "is in bits"), ("[bench]\nspeed = 3\n", "no setting 'speed'"),
     ("[nonsense]\n", "unknown section"), ("not toml [", "not valid TOML")],
)
def test_bad_config_file(cli, tmp_path: Path, text, needle):
    config = tmp_path / "c.toml"
    config.write_text(text)
    result = cli("--config", str(config), "bench", str(tmp_path))
    assert result.exit_code == 2
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_traceback_only_with_verbose(cli, tmp_path: Path):
    result = cli("-v", "bench", str(tmp_path / "missing"))
    assert result.exit_code == 2 and "Traceback" in result.stderr


def _fail_writes(monkeypatch, writer: str) -> None:
    """torch.save fails at once (EIO); dcp fails in the threads its FileSystemWriter writes from besides the
    caller's (``thread_count`` > 1): failures nothing reports back to ``dcp.save``."""
    import errno
    import threading

    import torch
    from torch.distributed.checkpoint.filesystem import FileSystem

    def torch_save(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    real_create_stream = FileSystem.create_stream

    def create_stream(self, path, mode):
        if "w" in mode and threading.current_thread() is not threading.main_thread():
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real_create_stream(self, path, mode)

    if writer == "torch":
        monkeypatch.setattr(torch, "save", torch_save)
    else:
        monkeypatch.setattr(FileSystem, "create_stream", create_stream)


@pytest.mark.parametrize("writer", ["torch", "dcp"])  # dcp: the failure is in a thread of its FileSystemWriter
def test_a_writer_failure_that_is_not_a_full_disk_is_one_line_naming_the_writer(cli, tmp_path: Path, monkeypatch,
                                                                                writer: str):
    import threading

    _fail_writes(monkeypatch, writer)
    unreported = []  # threads that died of an exception nobody caught: Python prints each as a traceback
    monkeypatch.setattr(threading, "excepthook", unreported.append)
    result = cli("bench", str(tmp_path), "--workload", "checkpoint", "--size", "4MiB", "--repeat", "1", "--warmup",
                 "0", "--writers", writer)
    assert result.exit_code == 1, (result.exit_code, result.stderr)  # a runtime I/O failure (errors.StorageIOError)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"ckptbench: error: {writer}: save at {tmp_path}"), lines[0]
    assert "OSError: [Errno 5] Input/output error" in lines[0] and "ran out of space" not in lines[0]
    assert result.stdout == "" and list(tmp_path.iterdir()) == []
    assert not unreported, [f"{a.thread.name}: {a.exc_value!r}" for a in unreported]

"""``ckptbench bench`` on object storage: the s3:// sweep and ``--workload checkpoint`` against the real
RGW, their cleanup (no objects, no open multipart uploads, also after Ctrl-C), their bad input, and
what needs no server (the sweep's grid, memory:// checkpoints, redaction of credentials)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptbench.bench.object_sweep import ObjectBenchSpec
from ckptbench.cli.bench import storage_options_from
from ckptbench.cli.render import redacted_argv
from ckptbench.errors import UsageError

MiB = 2**20


def _leftovers(client, bucket: str) -> tuple[list[str], list[str]]:
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    uploads = [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    return keys, uploads


def _options(server) -> list[str]:
    return ["--endpoint-url", server.endpoint, "--storage-option", f"key={server.key}",
            "--storage-option", f"secret={server.secret}"]


# -- no server needed ----------------------------------------------------------------------------


def test_grid_keeps_one_whole_object_part_size_per_object_size():
    spec = ObjectBenchSpec(size_bytes=64 * MiB, object_sizes=(8 * MiB, 32 * MiB), concurrency=(1, 4),
                           part_sizes=(5 * MiB, 16 * MiB, 64 * MiB))
    grid = spec.grid()
    # 8 MiB objects: 5 MiB parts, and one "whole object" entry (16 MiB; 64 MiB means the same); 32 MiB: 5, 16, 64.
    assert grid == [(8 * MiB, 1, 5 * MiB), (8 * MiB, 1, 16 * MiB), (8 * MiB, 4, 5 * MiB), (8 * MiB, 4, 16 * MiB),
                    (32 * MiB, 1, 5 * MiB), (32 * MiB, 1, 16 * MiB), (32 * MiB, 1, 64 * MiB),
                    (32 * MiB, 4, 5 * MiB), (32 * MiB, 4, 16 * MiB), (32 * MiB, 4, 64 * MiB)]
    assert spec.objects_per_run(8 * MiB) == 8 and spec.objects_per_run(32 * MiB) == 2


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"object_sizes": (128 * MiB,)}, "larger than --size"),
    ({"part_sizes": (MiB,)}, "outside S3's limits"),
    ({"concurrency": (0,)}, "at least 1"),
])
def test_object_spec_refuses_bad_values(kwargs, needle):
    with pytest.raises(UsageError, match=needle):
        ObjectBenchSpec(size_bytes=64 * MiB, **kwargs)


def test_storage_options_from_the_command_line():
    assert storage_options_from("http://h:1", ("part_size=8MiB", "max_concurrency= 4")) == {
        "part_size": "8MiB", "max_concurrency": " 4", "endpoint_url": "http://h:1"}
    with pytest.raises(UsageError, match="KEY=VALUE"):
        storage_options_from(None, ("secret",))
    with pytest.raises(UsageError) as info:
        storage_options_from(None, ("=hunter2",))
    assert "hunter2" not in str(info.value)


def test_result_files_never_carry_credentials():
    argv = ["s3://b/p", "--storage-option", "secret=hunter2", "--storage-option=key=AKIA1",
            "--storage-option", "part_size=8MiB", "--size", "1GiB"]
    assert redacted_argv(argv) == ["s3://b/p", "--storage-option", "secret=***", "--storage-option=key=***",
                                   "--storage-option", "part_size=8MiB", "--size", "1GiB"]


def test_checkpoint_workload_on_memory_store(cli):
    """Any fsspec URL takes the checkpoint workload (memory:// needs no server)."""
    doc = cli.json("bench", "memory://ckptbench-test/run", "--workload", "checkpoint", "--size", "16MiB",
                   "--repeat", "1", "--warmup", "0")
    (result,) = doc["results"]
    assert result["writer"] == "ckptbench" and result["verified"] is True
    assert doc["environment"]["target"]["filesystem"] == "memory"
    assert doc["cache_drop"]["method"] == "none"
    assert not [w for w in doc["warnings"] if w["code"] in ("cache-not-dropped", "direct-fallback")]
    import fsspec

    assert fsspec.filesystem("memory").find("/ckptbench-test") == []  # scratch removed


def test_object_sweep_needs_s3(cli):
    result = cli("bench", "memory://ckptbench-test/x")
    assert result.exit_code == 2 and "measures s3:// targets" in result.stderr


# -- against the real server (Ceph RGW) ----------------------------------------------------------


@pytest.mark.s3
def test_object_sweep_json_cleanup_and_no_secret(cli, s3_server, s3_bucket, tmp_path: Path):
    out = tmp_path / "results"
    result = cli("bench", f"s3://{s3_bucket}/bench", *_options(s3_server), "--size", "24MiB",
                 "--object-size", "6MiB,12MiB", "--concurrency", "1,4", "--part-size", "5MiB,16MiB",
                 "--repeat", "1", "--warmup", "0", "--json", "--output", str(out), "--plot", str(tmp_path / "s.png"))
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "ckptbench.bench.objects/1" and doc["data_verified"] is True
    configs = [(r["config"]["object_size_bytes"], r["config"]["concurrency"], r["config"]["parts_per_object"])
               for r in doc["results"]]
    assert configs == [(6 * MiB, 1, 2), (6 * MiB, 1, 1), (6 * MiB, 4, 2), (6 * MiB, 4, 1),
                       (12 * MiB, 1, 3), (12 * MiB, 1, 1), (12 * MiB, 4, 3), (12 * MiB, 4, 1)]
    for r in doc["results"]:
        assert r["write"]["gbps"] > 0 and r["read"]["gbps"] > 0
        parts = r["config"]["objects"] * r["config"]["parts_per_object"]
        assert r["write"]["latency_ms"]["count"] == parts  # one latency sample per request
        # the histogram counts the same requests, the timeline every byte of the run, by request completion
        assert r["write"]["latency_histogram"]["count"] == parts
        runs = r["write"]["timeline"]["runs"]
        assert len(runs) == 1 and sum(runs[0]["bytes"]) == r["write"]["bytes_per_run"]
    target = doc["environment"]["target"]
    assert target["endpoint"] == s3_server.endpoint and "storage_options" in target["credential_source"]
    assert "loopback-endpoint" in {w["code"] for w in doc["warnings"]}
    assert _leftovers(s3_server.client(), s3_bucket) == ([], [])
    (saved,) = out.iterdir()
    for text in (result.stdout, result.stderr, saved.read_text()):
        assert s3_server.secret not in text
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.s3
def test_object_sweep_table(cli, s3_server, s3_bucket):
    result = cli("bench", f"s3://{s3_bucket}", *_options(s3_server), "--size", "10MiB", "--object-size", "10MiB",
                 "--concurrency", "2", "--part-size", "5MiB", "--repeat", "1", "--warmup", "0", "--no-read")
    assert result.exit_code == 0, result.stderr
    assert "write MB/s" in result.stdout and "read MB/s" not in result.stdout
    assert "fastest median: 10 MiB objects x 2 in flight, 5 MiB parts" in result.stdout
    assert "best:" not in result.stdout and "tied" not in result.stdout  # one configuration: nothing to rank


@pytest.mark.s3
def test_checkpoint_workload_on_s3(cli, s3_server, s3_bucket):
    doc = cli.json("bench", f"s3://{s3_bucket}/ckpt", *_options(s3_server), "--workload", "checkpoint",
                   "--size", "32MiB", "--repeat", "1", "--warmup", "0")
    (result,) = doc["results"]
    assert result["verified"] is True and result["files"] >= 2  # shards + manifest
    (async_,) = doc["async"]
    assert async_["verified"] is True
    assert doc["environment"]["target"]["filesystem"] == "s3"
    assert _leftovers(s3_server.client(), s3_bucket) == ([], [])


@pytest.mark.s3
@pytest.mark.slow
def test_writers_side_by_side_on_s3(cli, s3_server, s3_bucket):
    """DCP's FsspecWriter and torch.save through s3fs next to ckptbench, every load verified."""
    pytest.importorskip("s3fs", reason="the dcp and torch writers on s3:// go through s3fs")
    doc = cli.json("bench", f"s3://{s3_bucket}/ckpt", *_options(s3_server), "--workload", "checkpoint",
                   "--size", "24MiB", "--repeat", "1", "--warmup", "0", "--writers", "ckptbench,dcp,torch")
    by_writer = {r["writer"]: r for r in doc["results"]}
    assert set(by_writer) == {"ckptbench", "dcp", "torch"}
    assert all(r["verified"] is True for r in doc["results"])
    assert by_writer["torch"]["files"] == 1 and by_writer["dcp"]["files"] >= 2  # data objects + .metadata
    assert _leftovers(s3_server.client(), s3_bucket) == ([], [])


@pytest.mark.s3
@pytest.mark.slow
def test_all_four_writers_side_by_side_on_s3(cli, s3_server, s3_bucket, monkeypatch):
    """ckptbench, DCP over s3fs, torch.save through s3fs and DCP with s3torchconnector (the AWS CRT), on one
    state_dict, every load verified. Through the relay that fills the empty ETag Ceph RGW 16 answers a
    multipart completion with, which the CRT needs (elsewhere a no-op); s3torchconnector takes its
    credentials from the environment only."""
    pytest.importorskip("s3fs", reason="the dcp and torch writers on s3:// go through s3fs")
    pytest.importorskip("s3torchconnector.dcp", reason="pip install 'ckptbench[s3torch]'")
    import faultproxy

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with faultproxy.FaultProxy(s3_server.endpoint, fill_etag=True) as relay:
        doc = cli.json("bench", f"s3://{s3_bucket}/ckpt", "--endpoint-url", relay.endpoint, "--workload", "checkpoint",
                       "--size", "24MiB", "--repeat", "1", "--warmup", "0",
                       "--writers", "ckptbench,dcp,torch,s3torchconnector")
    assert [r["writer"] for r in doc["results"]] == ["ckptbench", "dcp", "torch", "s3torchconnector"]
    assert all(r["verified"] is True for r in doc["results"]) and doc["failed_writers"] == []
    assert _leftovers(s3_server.client(), s3_bucket) == ([], [])


@pytest.mark.s3
def test_s3torchconnector_writer_needs_its_package(cli, s3_server, s3_bucket, monkeypatch):
    monkeypatch.setitem(sys.modules, "s3torchconnector.dcp", None)  # as if it were not installed
    result = cli("bench", f"s3://{s3_bucket}/x", *_options(s3_server), "--workload", "checkpoint",
                 "--size", "8MiB", "--writers", "ckptbench,s3torchconnector")
    assert result.exit_code == 2 and "pip install s3torchconnector" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert _leftovers(s3_server.client(), s3_bucket) == ([], [])


@pytest.mark.s3
@pytest.mark.parametrize(("extra", "needle"), [
    (["--workload", "checkpoint", "--writers", "ckptbench,safetensors"], "writes local files only"),
    (["--threads", "4"], "use --concurrency"),
    (["--block-size", "4MiB"], "applies to filesystem targets"),
    (["--workload", "checkpoint", "--part-size", "8MiB"], "object sweep"),
])
def test_bad_input_on_s3(cli, s3_server, s3_bucket, extra, needle):
    result = cli("bench", f"s3://{s3_bucket}/x", *_options(s3_server), "--size", "8MiB", *extra)
    assert result.exit_code == 2, result.stderr
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert _leftovers(s3_server.client(), s3_bucket) == ([], [])


@pytest.mark.s3
def test_missing_bucket_and_unreachable_endpoint(cli, s3_server):
    result = cli("bench", "s3://no-such-bucket-ckptbench/x", *_options(s3_server), "--size", "8MiB")
    assert result.exit_code == 2 and "'no-such-bucket-ckptbench' does not exist" in result.stderr
    start = time.monotonic()
    result = cli("bench", "s3://bucket/x", "--endpoint-url", "http://127.0.0.1:9", "--storage-option", "key=a",
                 "--storage-option", "secret=b", "--size", "8MiB")
    assert result.exit_code == 2 and "cannot reach the S3 endpoint http://127.0.0.1:9" in result.stderr
    assert time.monotonic() - start < 30


@pytest.mark.s3
def test_ctrl_c_during_the_sweep_leaves_nothing(s3_server, s3_bucket, tmp_path: Path):
    client = s3_server.client()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": s3_server.key, "AWS_SECRET_ACCESS_KEY": s3_server.secret,
           "AWS_ENDPOINT_URL": s3_server.endpoint}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptbench", "bench", f"s3://{s3_bucket}/sweep", "--size", "2GiB",
         "--object-size", "256MiB", "--concurrency", "2", "--part-size", "8MiB", "--repeat", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 90
        while not any(_leftovers(client, s3_bucket)):  # an upload has started
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no upload started"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert _leftovers(client, s3_bucket) == ([], [])


def _through(proxy, server) -> list[str]:
    return ["--endpoint-url", proxy.endpoint, *_options(server)[2:]]


@pytest.mark.s3
def test_object_sweep_reports_throttling(cli, s3_server, s3_bucket, fault_proxy):
    """Throttled answers, retries and the seconds they cost: in the JSON per phase, and on the console."""
    sweep = ["bench", f"s3://{s3_bucket}/bench", *_through(fault_proxy, s3_server), "--size", "10MiB",
             "--object-size", "10MiB", "--concurrency", "2", "--part-size", "5MiB", "--repeat", "1", "--warmup", "0"]
    fault_proxy.fail(2, status=503, kind="UploadPart")
    doc = cli.json(*sweep)
    assert fault_proxy.injected("status", "UploadPart") == 2
    fault_proxy.fail(1, status=503, kind="UploadPart")
    shown = cli(*sweep, "--no-read")
    (result,) = doc["results"]
    write, read = result["requests"]["write"], result["requests"]["read"]
    assert write["throttled"] == 2 and write["retries"] >= 2 and write["retry_s"] > 0
    assert write["requests"] >= 2
    assert read["throttled"] == 0 and read["retries"] == 0 and read["requests"] >= 2
    assert shown.exit_code == 0, shown.stderr
    assert "throttling: 1 throttled answers" in shown.stdout


@pytest.mark.s3
def test_checkpoint_workload_reports_throttling(cli, s3_server, s3_bucket, fault_proxy):
    fault_proxy.fail(2, status=503, kind="UploadPart")
    doc = cli.json("bench", f"s3://{s3_bucket}/ckpt", *_through(fault_proxy, s3_server), "--workload", "checkpoint",
                   "--size", "32MiB", "--repeat", "1", "--warmup", "0", "--storage-option", "part_size=5MiB")
    (result,) = doc["results"]
    counts = result["details"]["s3_requests"]
    assert counts["save"]["throttled"] == 2 and counts["save"]["retries"] >= 2
    assert counts["load"]["throttled"] == 0 and counts["load"]["requests"] >= 1


def _torchrun_bench(target: str, options: list[str], tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """``ckptbench bench target`` under torchrun, 2 gloo ranks on this host."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                          "MASTER_PORT")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), "-m", "ckptbench", "bench", target, *options, *extra, "--json"]
    proc = subprocess.run(cmd, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.mark.s3
def test_bench_under_torchrun_on_s3_every_rank_saves_and_loads_its_part(s3_server, s3_bucket, tmp_path: Path):
    """Restore fan-in: under torchrun (2 gloo ranks) every rank saves its share to RGW and then loads its
    own part at once (after one barrier), reported like the filesystem case; the scratch prefix is emptied."""
    proc = _torchrun_bench(f"s3://{s3_bucket}/dist", _options(s3_server), tmp_path, "--size", "24MiB",
                           "--repeat", "2", "--warmup", "0")
    doc = json.loads(proc.stdout)  # rank 0 alone prints
    assert doc["schema"] == "ckptbench.bench.distributed/1" and doc["launch"]["world_size"] == 2
    assert doc["target"] == f"s3://{s3_bucket}/dist" and doc["environment"]["target"]["filesystem"] == "s3"
    assert min(doc["rank_bytes"]) > 0 and sum(doc["rank_bytes"]) == doc["workload"]["total_bytes"]
    for op in ("save", "load", "async"):
        rounds = doc["rounds"][op]
        assert len(rounds) == 2
        for r in rounds:
            assert [s["rank"] for s in r["ranks"]] == [0, 1]
            assert [s["bytes"] for s in r["ranks"]] == doc["rank_bytes"]  # each rank its own part
            assert r["duration_s"] == max(s["end_s"] for s in r["ranks"])
        assert doc["summary"][op]["gbps"]["n"] == 2 and doc["summary"][op]["gbps"]["median"] > 0
    assert doc["data_verified"] is True
    assert _leftovers(s3_server.client(), s3_bucket) == ([], [])
    assert s3_server.secret not in proc.stdout + proc.stderr


@pytest.mark.s3
def test_bench_under_torchrun_on_s3_counts_every_ranks_throttling(s3_server, s3_bucket, fault_proxy, tmp_path: Path,
                                                                  capsys):
    """Each rank counts what its S3 data requests met (throttled answers, retries, their seconds); the
    counts are summed per round and per operation in the JSON, and printed per operation."""
    from ckptbench.cli.launch import print_distributed_tables

    fault_proxy.fail(3, status=503, kind="UploadPart")
    proc = _torchrun_bench(f"s3://{s3_bucket}/dist", _through(fault_proxy, s3_server), tmp_path, "--size", "24MiB",
                           "--repeat", "1", "--warmup", "0", "--storage-option", "part_size=5MiB")
    doc = json.loads(proc.stdout)
    assert fault_proxy.injected("status", "UploadPart") == 3
    summary, rounds = doc["summary"], doc["rounds"]
    for op in ("save", "load", "async"):
        (round_,) = rounds[op]
        per_rank = [span["s3_requests"] for span in round_["ranks"]]
        assert all(counts["requests"] >= 1 for counts in per_rank)  # both ranks sent their part
        for field in ("requests", "throttled", "retries", "errors"):
            assert round_["s3_requests"][field] == sum(counts[field] for counts in per_rank)
            assert summary[op]["s3_requests"][field] == round_["s3_requests"][field]
    assert summary["save"]["s3_requests"]["throttled"] + summary["async"]["s3_requests"]["throttled"] == 3
    throttled = [op for op in ("save", "async") if summary[op]["s3_requests"]["throttled"]]
    assert all(summary[op]["s3_requests"]["retries"] >= summary[op]["s3_requests"]["throttled"] and
               summary[op]["s3_requests"]["retry_s"] > 0 for op in throttled)
    assert summary["load"]["s3_requests"]["throttled"] == 0
    print_distributed_tables(doc)
    shown = capsys.readouterr().out
    first = throttled[0]
    line = {"save": "durable save", "async": "async save"}[first]
    assert f"{line}, all ranks: throttling: {summary[first]['s3_requests']['throttled']} throttled answers" in shown
    assert "cold load, all ranks: throttling: none" in shown

"""The durable mode per target on a real network filesystem (CephFS through ceph-fuse): ``bench`` measures
both modes and reports the faster, and an auto save records a choice that is one of those it measured and
the faster beyond the noise. Small I/O; no timing is asserted, only that choices follow the samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ckptbench
from ckptbench.checkpoint import tuning


@pytest.mark.netfs
def test_bench_on_cephfs_measures_both_durable_modes(cli, cephfs_dir: Path, tmp_path: Path):
    result = cli("bench", str(cephfs_dir), "--size", "16MiB", "--files", "2", "--threads", "2", "--block-size",
                 "1MiB", "--repeat", "2", "--warmup", "0", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["environment"]["target"]["filesystem"].startswith("fuse")
    for row in doc["results"]:
        modes = row["durable_modes"]
        chosen, _ = tuning.faster_mode(modes["direct"]["write_runs_gbps"], modes["buffered"]["write_runs_gbps"],
                                       default=False)  # a tie keeps buffered + fdatasync on a FUSE mount
        assert modes["write_direct"] is chosen
        assert row["config"]["direct"] is chosen
        assert row["write"]["runs_gbps"] == modes["direct" if chosen else "buffered"]["write_runs_gbps"]
        assert modes["read_direct"] in (True, False) and row["read"] is not None
    assert not [w for w in doc["warnings"] if w["code"] == "direct-fallback"]
    assert list(cephfs_dir.iterdir()) == []


def test_bench_on_a_local_disk_measures_one_mode(cli, tmp_path: Path):
    result = cli("bench", str(tmp_path), "--size", "4MiB", "--files", "1", "--threads", "1", "--block-size", "1MiB",
                 "--repeat", "1", "--warmup", "0", "--no-read", "--json")
    assert result.exit_code == 0, result.stderr
    assert "durable_modes" not in json.loads(result.stdout)["results"][0]


@pytest.mark.parametrize(("fstype", "schedule"), [("fuse.ceph-fuse", "per-file"), ("nfs4", "per-file"), ("ext4", "shared")])
def test_bench_streams_whole_files_on_network_mounts_by_default(cli, tmp_path: Path, monkeypatch, fstype, schedule):
    """The default schedule follows the checkpoint writer: one stream per file on a network or FUSE mount
    (here the mount type is what /proc/mounts would say; the bytes go to a local directory)."""
    from ckptbench.storage import local_target

    monkeypatch.setattr(local_target, "mount_of", lambda path, *a: local_target.MountInfo("/", "d", fstype, "rw"))
    args = ["bench", str(tmp_path), "--size", "2MiB", "--files", "2", "--threads", "2", "--block-size", "1MiB",
            "--repeat", "1", "--warmup", "0", "--no-read", "--buffered", "--json"]
    assert json.loads(cli(*args).stdout)["results"][0]["config"]["schedule"] == schedule
    given = json.loads(cli(*args, "--schedule", "shared").stdout)
    assert given["results"][0]["config"]["schedule"] == "shared"


@pytest.mark.netfs
def test_auto_save_on_cephfs_records_the_faster_measured_mode(cephfs_dir: Path, monkeypatch):
    monkeypatch.setattr(tuning.knobs, "TUNE", 1)
    monkeypatch.setattr(tuning.knobs, "TUNE_MIN_BYTES", 0)
    monkeypatch.setattr(tuning.knobs, "TUNE_PROBE_BYTES", 8 << 20)
    tuning.forget()
    state = {"w": torch.arange(1 << 20, dtype=torch.float32)}
    try:
        result = ckptbench.save(state, cephfs_dir / "auto")
        t = result.tuning
        assert t["fstype"] == "fuse.ceph-fuse" and t["network"] is True
        assert t["direct"]["source"] == "measured"
        measured = t["measured"]
        assert measured["direct_gbps"] and measured["buffered_gbps"]
        expected, _ = tuning.faster_mode(measured["direct_gbps"], measured["buffered_gbps"], default=False)
        assert t["direct"]["value"] is expected and result.direct is expected
        # buffered there: written from the tensor's own memory, no staging copy
        assert t["zero_copy"]["value"] is (not expected) and (result.staging == "zero-copy") is (not expected)
        assert str(t["threads"]["value"]) in {str(tuning.knobs.SAVE_THREADS), *measured.get("threads_gbps", {})}
        assert torch.equal(ckptbench.load(cephfs_dir / "auto")["w"], state["w"])
        assert not [p for p in (cephfs_dir / "auto").iterdir() if p.name.startswith(".ckptbench-tune-")]
    finally:
        tuning.forget()

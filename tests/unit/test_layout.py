"""What a parallel filesystem's layout implies (bench/layout.py): Lustre and BeeGFS stripe counts read with
their tools (fake tools on PATH here, as no such filesystem is mounted on CI), NFS's nconnect from the mount
options, and a note that says why it was skipped when the tool is missing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ckptbench.bench.layout import layout_notes


def _tool(directory: Path, name: str, output: str, monkeypatch) -> None:
    script = directory / name
    script.write_text(f"#!/bin/sh\ncat <<'OUT'\n{output}\nOUT\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ['PATH']}")


def test_lustre_stripe_count_below_the_streams(tmp_path, monkeypatch):
    _tool(tmp_path, "lfs", "stripe_count:  1 stripe_size:   1048576 pattern:       raid0 stripe_offset: -1",
          monkeypatch)
    notes = layout_notes(tmp_path, "lustre", "rw", streams=4)
    assert notes["stripe_count"] == 1 and notes["stripe_size_bytes"] == 1 << 20
    assert "fewer than the 4 writer streams" in notes["note"] and "lfs setstripe" in notes["note"]


def test_lustre_striped_over_every_target(tmp_path, monkeypatch):
    _tool(tmp_path, "lfs", "stripe_count:  -1 stripe_size:   4194304", monkeypatch)
    notes = layout_notes(tmp_path, "lustre", "rw", streams=8)
    assert notes["stripe_count"] == -1 and "every target" in notes["note"] and "fewer" not in notes["note"]


def test_beegfs_targets(tmp_path, monkeypatch):
    _tool(tmp_path, "beegfs-ctl", "Entry type: directory\nChunksize: 512K\nNumber of storage targets: desired: 2",
          monkeypatch)
    notes = layout_notes(tmp_path, "beegfs", "rw", streams=4)
    assert (notes["stripe_count"], notes["chunk_size"]) == (2, "512K") and "fewer than the 4" in notes["note"]


@pytest.mark.parametrize(("fstype", "tool"), [("lustre", "lfs"), ("beegfs", "beegfs-ctl")])
def test_a_missing_tool_skips_with_the_reason(tmp_path, monkeypatch, fstype, tool):
    monkeypatch.setenv("PATH", str(tmp_path))
    notes = layout_notes(tmp_path, fstype, "rw", streams=2)
    assert notes == {"filesystem": fstype, "skipped": f"{tool} not found on PATH: the layout is unknown"}


def test_nfs_nconnect_from_the_mount_options(tmp_path):
    assert layout_notes(tmp_path, "nfs4", "rw,vers=4.2,nconnect=8", streams=4)["nconnect"] == 8
    notes = layout_notes(tmp_path, "nfs4", "rw,vers=4.2", streams=4)
    assert notes["nconnect"] == 1 and "nconnect=4" in notes["note"]


@pytest.mark.parametrize("fstype", ["ext4", "xfs", "fuse.ceph-fuse", "tmpfs", None])
def test_no_layout_elsewhere(tmp_path, fstype):
    assert layout_notes(tmp_path, fstype, "rw", streams=4) is None


def test_a_real_lustre_mount_where_there_is_one():
    lustre = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines() if line.split()[2:3] == ["lustre"]]
    if not lustre:
        pytest.skip("no Lustre filesystem is mounted here")
    notes = layout_notes(Path(lustre[0]), "lustre", "", streams=4)
    assert "note" in notes or "skipped" in notes

"""``ckptbench clean DIR``: removes the scratch directories killed runs of this host left, lists the others
with why they were kept; bad input is one line, exit 2."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from ckptbench.storage import owner
from ckptbench.storage.local_target import SCRATCH_PREFIX


@pytest.fixture
def leftovers(tmp_path: Path, scratch_leftover) -> dict[str, Path]:
    me = owner.ProcessOwner.me()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.bin").write_bytes(b"p")
    target = tmp_path / "target"
    target.mkdir()
    link = target / f"{SCRATCH_PREFIX}5-link"
    link.symlink_to(victim)
    return {
        "dead": scratch_leftover(target, f"{os.getpid()}-dead", dataclasses.replace(me, process_start="1")),
        "live": scratch_leftover(target, f"{os.getpid()}-live", me),
        "other host": scratch_leftover(target, "7-far", dataclasses.replace(me, host=me.host + "-other")),
        "unknown owner": scratch_leftover(target, "8-old", None),
        "not a directory": link,
        "target": target, "victim": victim,
    }


def test_clean_removes_the_dead_ones_and_says_why_it_kept_the_others(cli, leftovers) -> None:
    doc = cli.json("clean", str(leftovers["target"]))
    actions = {e["path"]: (e["action"], e["state"]) for e in doc["entries"]}
    assert actions == {
        str(leftovers["dead"]): ("removed", "dead"),
        **{str(leftovers[s]): ("kept", s) for s in ("live", "other host", "unknown owner", "not a directory")}}
    assert all(e["why_kept"] for e in doc["entries"] if e["action"] == "kept")
    assert doc["removed_bytes"] >= 65536
    assert not leftovers["dead"].exists()
    assert all(leftovers[s].is_dir() for s in ("live", "other host", "unknown owner"))
    assert os.listdir(leftovers["victim"]) == ["precious.bin"] and leftovers["not a directory"].is_symlink()


def test_clean_dry_run_removes_nothing(cli, leftovers) -> None:
    out = cli("clean", str(leftovers["target"]), "--dry-run")
    assert out.exit_code == 0, out.stderr
    assert f"would remove {leftovers['dead']}" in out.stdout and "would free" in out.stdout
    assert (leftovers["dead"] / "shard-00000.bin").is_file()


def test_clean_table_names_each_entry(cli, leftovers) -> None:
    out = cli("clean", str(leftovers["target"]))
    assert out.exit_code == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("removed") and str(leftovers["dead"]) in line for line in lines)
    assert any(line.startswith("kept") and str(leftovers["other host"]) in line and "another host" in line
               for line in lines)


def test_clean_of_a_directory_without_leftovers(cli, tmp_path: Path) -> None:
    doc = cli.json("clean", str(tmp_path))
    assert doc["entries"] == [] and doc["removed_bytes"] == 0


@pytest.mark.parametrize("kind", ["missing", "file", "empty", "link to a file"])
def test_clean_bad_input_is_one_line_exit_2(cli, tmp_path: Path, kind: str) -> None:
    (tmp_path / "a-file").write_bytes(b"f")
    (tmp_path / "link").symlink_to(tmp_path / "a-file")
    arg = {"missing": str(tmp_path / "nowhere"), "file": str(tmp_path / "a-file"), "empty": "",
           "link to a file": str(tmp_path / "link")}[kind]
    out = cli("clean", arg)
    assert out.exit_code == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptbench: error:"), out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["a-file", "link"]


def test_clean_json_is_one_document(cli, leftovers) -> None:
    out = cli("clean", str(leftovers["target"]), "--dry-run", "--format", "json")
    assert json.loads(out.stdout)["schema"] == "ckptbench.clean/1"


def test_clean_of_a_file_url_cleans_that_directory(cli, leftovers, tmp_path: Path) -> None:
    """``file://DIR`` (as ``bench`` takes it) is the directory DIR: its leftovers found and removed, and a
    directory that is not there is bad input."""
    doc = cli.json("clean", f"file://{leftovers['target']}")
    assert [e["path"] for e in doc["entries"] if e["action"] == "removed"] == [str(leftovers["dead"])]
    assert not leftovers["dead"].exists()
    out = cli("clean", f"file://{tmp_path / 'absent'}")
    assert out.exit_code == 2 and "does not exist" in out.stderr and len(out.stderr.strip().splitlines()) == 1

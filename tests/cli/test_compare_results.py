"""``ckptbench compare-results OLD NEW``: ratios with their uncertainty from the runs, the tie rule for
"beyond the noise", ``--fail-if-slower`` as a CI gate, and one line with exit 2 for files it cannot compare."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from ckptbench.bench.baseline import Change

RESULTS = Path(__file__).resolve().parents[2] / "results"
CKPT_RESULT = RESULTS / "bench-checkpoint-vm-20261126T055124.json"
FS_RESULT = RESULTS / "bench-vm-20261126T042848.json"


def _fs(tmp_path: Path, name: str, configs: dict[tuple[int, int], list[float]]) -> Path:
    """A filesystem-sweep result with the given write runs (GB/s) per (threads, block size)."""
    results = [{"config": {"threads": t, "block_size": b, "schedule": "shared"},
                "write": {"runs_gbps": runs, "gbps": statistics.median(runs), "bytes_per_run": 2**30}, "read": None}
               for (t, b), runs in configs.items()]
    path = tmp_path / name
    path.write_text(json.dumps({"schema": "ckptbench.bench.fs/1", "target": "/mnt/x", "results": results,
                                "leaders": [0]}))
    return path


def _doc(out: Any) -> dict[str, Any]:
    return json.loads(out.stdout)


def test_same_result_is_one_within_the_noise(cli):
    out = cli("compare-results", str(CKPT_RESULT), str(CKPT_RESULT), "--fail-if-slower", "5%", "--format", "json")
    assert out.exit_code == 0, out.stderr
    changes = _doc(out)["changes"]
    assert {c["configuration"] for c in changes} == {"ckptbench", "torch", "dcp", "safetensors", "fio"}
    assert all(c["ratio"] == pytest.approx(1.0) for c in changes)
    assert all(c["verdict"] == "within the noise" and not c["regression"] for c in changes)


def test_a_slower_new_result_fails_the_gate(cli, tmp_path):
    old = _fs(tmp_path, "old.json", {(4, 2**22): [2.0, 2.1, 1.9]})
    new = _fs(tmp_path, "new.json", {(4, 2**22): [1.6, 1.62, 1.58]})
    out = cli("compare-results", str(old), str(new), "--fail-if-slower", "10%")
    assert out.exit_code == 1
    assert "NEW is 0.80 ± 0.04x OLD" in out.stdout
    assert "beyond the noise" in out.stdout and "REGRESSION" in out.stdout
    assert "1 regression past 10%" in out.stderr and "write_gbps" in out.stderr
    # the same files, a looser gate: the change is still reported, the exit status is 0
    looser = cli("compare-results", str(old), str(new), "--fail-if-slower", "25%", "--format", "json")
    assert looser.exit_code == 0
    (change,) = _doc(looser)["changes"]
    assert change["verdict"] == "worse" and change["slower_by"] == pytest.approx(0.2)


def test_a_faster_new_result_passes_the_gate(cli, tmp_path):
    old = _fs(tmp_path, "old.json", {(4, 2**22): [1.0, 1.1, 0.9]})
    new = _fs(tmp_path, "new.json", {(4, 2**22): [1.8, 1.9, 1.7]})
    out = cli("compare-results", str(old), str(new), "--fail-if-slower", "10%", "--format", "json")
    assert out.exit_code == 0
    (change,) = _doc(out)["changes"]
    assert change["verdict"] == "better" and change["ratio"] == pytest.approx(1.8)


def test_uncertainty_propagates_both_sides_relative_spread():
    old, new = (1.0, 1.2, 0.8), (2.0, 2.8, 1.1)
    change = Change("c", "write_gbps", old, new)
    expected = 2.0 * math.hypot(statistics.stdev(old) / statistics.fmean(old),
                                statistics.stdev(new) / statistics.fmean(new))
    assert change.ratio == pytest.approx(2.0)
    assert change.ratio_error == pytest.approx(expected)
    assert change.verdict == "within the noise"  # 1.1 < 1.2: the runs overlap


def test_a_single_run_side_gives_no_spread_and_no_verdict(cli, tmp_path):
    old = _fs(tmp_path, "old.json", {(1, 2**20): [1.0]})
    new = _fs(tmp_path, "new.json", {(1, 2**20): [2.0, 2.2, 1.8]})
    out = cli("compare-results", str(old), str(new))
    assert out.exit_code == 0, out.stderr
    assert "OLD had a single run" in out.stdout
    change = Change("c", "write_gbps", (1.0,), (2.0, 2.2, 1.8))
    assert change.verdict == "unknown"
    assert change.ratio_error == pytest.approx(2.0 * statistics.stdev((2.0, 2.2, 1.8)) / 2.0)


def test_times_are_slower_when_higher(tmp_path):
    change = Change("ckptbench", "stall_s", (0.10, 0.11, 0.09), (0.15, 0.16, 0.14))
    assert change.slower_by() == pytest.approx(0.5)
    assert change.verdict == "worse"
    assert Change("ckptbench", "interference", (0.1,), (0.5,)).slower_by() is None  # not a speed


def test_configurations_in_one_file_only_are_listed(cli, tmp_path):
    old = _fs(tmp_path, "old.json", {(1, 2**20): [1.0, 1.1], (2, 2**20): [1.5, 1.6]})
    new = _fs(tmp_path, "new.json", {(1, 2**20): [1.0, 1.1], (8, 2**20): [3.0, 3.1]})
    out = cli("compare-results", str(old), str(new), "--format", "json")
    doc = _doc(out)
    assert [c["configuration"] for c in doc["changes"]] == ["1 thread x 1 MiB (shared)"]
    assert doc["only_old"] == ["2 threads x 1 MiB (shared)"] and doc["only_new"] == ["8 threads x 1 MiB (shared)"]


def test_csv_has_one_row_per_configuration_and_metric(cli):
    out = cli("compare-results", str(FS_RESULT), str(FS_RESULT), "--format", "csv")
    assert out.exit_code == 0, out.stderr
    found = list(csv.DictReader(io.StringIO(out.stdout)))
    results = json.loads(FS_RESULT.read_text())["results"]
    assert len(found) == 2 * len(results)  # write and read
    assert {r["metric"] for r in found} == {"write_gbps", "read_gbps"}
    assert all(float(r["ratio"]) == 1.0 for r in found)


@pytest.mark.parametrize("case", ["kinds", "schema", "nothing-in-common", "not-json"])
def test_files_it_cannot_compare_exit_2_with_one_line(cli, tmp_path, case):
    old = _fs(tmp_path, "old.json", {(1, 2**20): [1.0, 1.1]})
    if case == "kinds":
        new = CKPT_RESULT
    elif case == "schema":
        new = tmp_path / "new.json"
        new.write_text(json.dumps({"schema": "ckptbench.bench.fs/9", "results": []}))
    elif case == "nothing-in-common":
        new = _fs(tmp_path, "new.json", {(2, 2**20): [1.0, 1.1]})
    else:
        new = tmp_path / "new.json"
        new.write_text("{")
    out = cli("compare-results", str(old), str(new), "--fail-if-slower", "10%")
    assert out.exit_code == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("ckptbench: error:")


def test_a_writer_that_failed_in_one_shoot_out_is_named_as_failed_not_only_missing(cli, tmp_path: Path):
    """A shoot-out leaves a failed competitor out of its results (``failed_writers``); comparing it with one
    where that writer ran says it failed there, with its error, besides listing it as only in the other."""
    new = json.loads(CKPT_RESULT.read_text())
    new["results"] = [r for r in new["results"] if r["writer"] != "torch"]
    new["failed_writers"] = [{"writer": "torch", "during": "its save/load round 1/3",
                              "error": "save at /x/torch-1 failed: OSError: [Errno 28] No space left"}]
    path = tmp_path / "new.json"
    path.write_text(json.dumps(new))
    doc = _doc(cli("compare-results", str(CKPT_RESULT), str(path), "--json"))
    assert doc["failed_new"] == {"torch": "save at /x/torch-1 failed: OSError: [Errno 28] No space left"}
    assert doc["failed_old"] == {} and any("torch" in label for label in doc["only_old"])
    table = cli("compare-results", str(CKPT_RESULT), str(path))
    assert table.exit_code == 0 and "torch failed in NEW" in table.stdout and "Errno 28" in table.stdout


def test_a_run_of_1e400_reads_as_no_run_not_a_traceback(cli, tmp_path: Path):
    """JSON's 1e400 parses as infinity (NaN and Infinity themselves are refused): such a run is no
    measurement, left out of the comparison rather than handed to statistics."""
    document = json.loads(CKPT_RESULT.read_text())
    document["async"][0]["runs_stall_s"] = ["HUGE"] + document["async"][0]["runs_stall_s"][1:]
    new = tmp_path / "new.json"
    new.write_text(json.dumps(document).replace('"HUGE"', "1e400"))
    out = cli("compare-results", str(CKPT_RESULT), str(new), "--format", "json")
    assert out.exit_code == 0, out.stderr
    assert all(math.isfinite(s) for c in _doc(out)["changes"] for s in c["new_samples"])

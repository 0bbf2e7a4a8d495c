"""``ckptbench report``: HTML and Markdown from the reference runs in results/ (read only) and from small
hand-made documents; self-contained output, the key numbers, bad input refused with one line and
nothing written. Whether the page renders in a browser: tests/perf/report_render_check.sh."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckptbench.report import sections

RESULTS = Path(__file__).resolve().parents[2] / "results"
FS_RESULT = RESULTS / "bench-vm-20261126T042848.json"
CKPT_RESULT = RESULTS / "bench-checkpoint-vm-20261126T055124.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

ENVIRONMENT = {"host": "node7", "kernel": "6.1.0-test", "python": "3.11.7", "cpu_model": "Test CPU", "cpu_count": 4,
               "memory_bytes": 8 * 2**30, "tool_version": "0.1.0", "git_sha": None}


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir()}


def _assert_self_contained(html: str) -> list[bytes]:
    """No external reference at all; every image an inline PNG. Returns the PNGs."""
    refs = re.findall(r'\b(?:src|href)\s*=\s*"([^"]*)"', html, flags=re.IGNORECASE)
    assert refs, "no src/href at all"
    for ref in refs:
        assert not re.match(r"(?i)(https?:)?//", ref), ref
        assert ref.startswith(("#", "data:image/png;base64,")), ref[:60]
    assert "<script" not in html.lower()
    assert "@import" not in html and "url(" not in html
    images = re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', html)
    pngs = [base64.b64decode(data, validate=True) for data in images]
    assert pngs and all(p.startswith(PNG_MAGIC) for p in pngs)
    return pngs


def _one_error_line(result: Any) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ckptbench: error: ") and "Traceback" not in result.stderr
    return lines[0]


# -- from the reference runs -----------------------------------------------------------------------------


def test_html_from_reference_runs(cli, tmp_path: Path):
    before = _snapshot(RESULTS)
    out = tmp_path / "report.html"
    result = cli("report", str(FS_RESULT), str(CKPT_RESULT), "--html", str(out), "--title", "VM storage")
    assert result.exit_code == 0, result.stderr
    assert _snapshot(RESULTS) == before  # results/ is only read
    assert f"report: {out}" in result.stdout and "2 result files" in result.stdout
    html = out.read_text()
    pngs = _assert_self_contained(html)
    # fs: bars + heat map; checkpoint: shoot-out; tier comparison across the two files.
    assert len(pngs) == 4
    assert "<h1>VM storage</h1>" in html and "ckptbench 0.1.0" in html

    fs, ckpt = _load(FS_RESULT), _load(CKPT_RESULT)
    best = fs["results"][fs["best"]]
    assert f"{best['write']['gbps']:.2f}" == "2.03"
    assert re.search(r'<tr class="best">(<td[^>]*>[^<]*</td>){2}<td class="num">2\.03</td>', html)
    assert f"write {best['write']['gbps']:.2f} GB/s, read {best['read']['gbps']:.2f} GB/s" in html
    for record in fs["results"]:
        assert f">{record['read']['gbps']:.2f}<" in html
    assert f">{fs['metadata'][0]['ops_per_s']:.0f}<" in html  # small-file rate
    ours = next(r for r in ckpt["results"] if r["writer"] == "ckptbench")
    assert f">{ours['save']['gbps']:.2f}<" in html and f">{ours['load']['gbps']:.2f}<" in html
    assert "Tier comparison" in html and "Filesystem sweep: /var/tmp" in html and "Checkpoint writers: /var/tmp" in html
    # Where it was measured, the command, and every warning with its remedy.
    assert "AMD EPYC, 2 CPUs" in html and "6.18.44-fc-v669" in html and "ext4 on /dev/vda at /var/tmp" in html
    assert "ckptbench bench /var/tmp --size 2GiB" in html
    for warning in ckpt["warnings"]:
        assert warning["message"].replace("'", "&#x27;") in html
        assert f"remedy: {warning['remedy']}" in html
    # the project's development goals are not shown as met or missed: their ratios are, as facts
    assert any(not g["met"] for g in ckpt["goals"]) and "MISSED" not in html and ">met<" not in html
    for g in ckpt["goals"]:
        assert f">{g['value']:.2f}<" in html and g["description"] in html


def test_markdown_links_figures_that_exist(cli, tmp_path: Path):
    out = tmp_path / "docs" / "storage.md"
    out.parent.mkdir()
    result = cli("report", str(FS_RESULT), str(CKPT_RESULT), "--markdown", str(out))
    assert result.exit_code == 0, result.stderr
    text = out.read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links == [f"storage-{i}.png" for i in range(1, 5)]
    for link in links:
        png = out.parent / link
        assert png.read_bytes().startswith(PNG_MAGIC)
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(["storage.md", *links])
    fs = _load(FS_RESULT)
    assert "| threads | block | write GB/s |" in text
    assert re.search(r"\| \*\*1\*\* \| \*\*16 MiB\*\* \| \*\*2\.03\*\* \|", text)  # the best row, in bold
    assert "|---:|---:|---:|" in text
    assert f"**host**: {fs['environment']['host']}" in text
    assert "remedy: use a larger --scale/--size or more --repeat, on a quiet machine" in text.replace("\\", "")
    assert not re.search(r"https?://", text)


def test_default_is_report_html_in_the_current_directory(cli, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("report", str(FS_RESULT))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("report: report.html (1 result file, 2 figures)")
    _assert_self_contained((tmp_path / "report.html").read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_html_and_markdown_together_and_html_to_stdout(cli, tmp_path: Path):
    result = cli("report", str(FS_RESULT), "--html", str(tmp_path / "a.html"), "--markdown", str(tmp_path / "a.md"))
    assert result.exit_code == 0, result.stderr
    assert {p.name for p in tmp_path.iterdir()} == {"a.html", "a.md", "a-1.png", "a-2.png"}
    result = cli("report", str(FS_RESULT), "--html", "-")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("<!DOCTYPE html>")
    _assert_self_contained(result.stdout)


def test_markdown_to_standard_output_is_refused_and_writes_nothing(cli, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("report", str(FS_RESULT), "--markdown", "-")
    assert result.exit_code == 2 and "--markdown cannot write to standard output" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no file named "-", no "--1.png"


def test_ckptbench_alone_prints_its_help(cli):
    result = cli()
    assert result.exit_code == 0 and "error" not in result.stderr
    assert result.stdout.startswith("Usage: ") and "preflight" in result.stdout and "Commands:" in result.stdout


def test_help_teaches(cli):
    result = cli("report", "--help")
    assert result.exit_code == 0
    for text in ("Examples:", "--markdown", "report.html", "ckptbench.bench.fs/1", "--skip-unknown", "exit 2"):
        assert text in result.stdout


# -- hand-made documents ----------------------------------------------------------------------------------


def _phase(op: str, rates_gbps: list[float], nbytes: int = 256 * 2**20) -> Any:
    from ckptbench.bench.records import PhaseResult

    return PhaseResult(op=op, bytes_per_run=nbytes, runs_s=tuple(nbytes / (r * 1e9) for r in rates_gbps),
                       latencies_ns=np.array([2_000_000, 3_000_000, 9_000_000], dtype=np.int64), thread_spans=(),
                       direct_used=False, sync="s3-complete" if op == "write" else "none", fallback_reason="")


def object_document() -> dict[str, Any]:
    """An s3:// sweep shaped by the real records (no server needed): 2 object sizes x 2 concurrencies."""
    from ckptbench.bench.object_sweep import ObjectBenchReport, ObjectBenchSpec, ObjectConfigResult

    spec = ObjectBenchSpec(size_bytes=256 * 2**20, object_sizes=(16 * 2**20, 64 * 2**20), concurrency=(1, 8),
                           part_sizes=(16 * 2**20,), repeat=3, warmup=1)
    results = []
    for obj, conc, part in spec.grid():
        write = 0.1 * conc ** 0.5 * (obj / 2**24) ** 0.2
        results.append(ObjectConfigResult(obj, spec.objects_per_run(obj), conc, part,
                                          _phase("write", [write, write * 1.05, write * 0.95]),
                                          _phase("read", [write * 2, write * 2.1, write * 1.9])))
    environment = {**ENVIRONMENT, "target": {"url": "s3://bucket/ckpt", "filesystem": "s3",
                                             "endpoint": "http://rgw.example:7480", "endpoint_source": "--endpoint-url",
                                             "credential_source": "env"}}
    report = ObjectBenchReport("s3://bucket/ckpt", spec, tuple(results), environment, data_verified=True,
                               created="2026-11-26T08:00:00+00:00")
    return report.to_dict()


def _write(path: Path, document: Any) -> Path:
    path.write_text(json.dumps(document) if not isinstance(document, str) else document)
    return path


def test_object_sweep(cli, tmp_path: Path):
    doc = object_document()
    source = _write(tmp_path / "s3.json", doc)
    out = tmp_path / "s3.html"
    result = cli("report", str(source), "--html", str(out))
    assert result.exit_code == 0, result.stderr
    html = out.read_text()
    assert len(_assert_self_contained(html)) == 2  # bars + heat map (2 sizes x 2 concurrencies)
    best = doc["results"][doc["best"]]
    assert best["config"]["concurrency"] == 8 and best["config"]["object_size_bytes"] == 64 * 2**20
    assert f"write {best['write']['gbps'] * 1e3:.0f} MB/s, read {best['read']['gbps'] * 1e3:.0f} MB/s" in html
    assert "best (highest median write): 64 MiB objects x 8 in flight, 16 MiB parts" in html
    assert "s3 at http://rgw.example:7480 (from --endpoint-url); credentials from env" in html
    assert "Object-storage sweep: s3://bucket/ckpt" in html
    # The endpoint is text, never a link.
    assert 'href="http' not in html and 'src="http' not in html


def test_a_new_schema_is_one_function_with_checks_verdict_and_waste_curve(cli, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(sections, "SECTIONS", dict(sections.SECTIONS))

    @sections.section("ckptbench.preflight/1")
    def preflight(document: dict[str, Any]) -> sections.Section:
        return sections.Section(title=f"Pre-flight: {document['target']}", lines=("checkpoint 140 GB every 30 min",))

    curve = [{"interval_s": t, "waste_fraction": 20.0 / t + t / 20_000.0} for t in (60, 120, 300, 600, 900, 1800,
                                                                                    3600, 7200)]
    doc = {
        "schema": "ckptbench.preflight/1", "created": "2026-11-26T09:00:00+00:00", "target": "/mnt/lustre/ckpt",
        "environment": {**ENVIRONMENT, "target": {"path": "/mnt/lustre/ckpt", "filesystem": "lustre"}},
        "verdict": "FAIL",
        "checks": [
            {"name": "write_bandwidth", "status": "PASS", "value": 12.5, "threshold": 10.0, "unit": "_gbps",
             "detail": "sustained durable write"},
            {"name": "checkpoint_time", "status": "FAIL", "value": 190.0, "threshold": 120.0, "unit": "_s"},
        ],
        "model": {"optimal_interval_s": 632.0, "interval_s": 1800.0, "waste_fraction": 0.063, "curve": curve},
        "warnings": [{"code": "x", "message": "free space < 3 checkpoints", "remedy": "clean up old checkpoints"}],
    }
    out = tmp_path / "pf.html"
    result = cli("report", str(_write(tmp_path / "pf.json", doc)), "--html", str(out))
    assert result.exit_code == 0, result.stderr
    html = out.read_text()
    assert len(_assert_self_contained(html)) == 1  # the waste curve
    assert "Pre-flight: /mnt/lustre/ckpt" in html and '<span class="verdict fail">FAIL</span>' in html
    assert re.search(r'<tr class="failed"><td>checkpoint_time</td><td class="fail">FAIL</td>'
                     r'<td[^>]*>3m 10s</td><td[^>]*>2m</td><td>-</td></tr>', html)
    assert "<th>unit</th>" not in html  # the suffix unit is in the values already
    assert ">12.50 GB/s<" in html and ">10.00 GB/s<" in html and ">sustained durable write<" in html
    assert re.search(r"<td>optimal interval</td><td[^>]*>10m 32s</td>", html)
    assert re.search(r"<td>waste</td><td[^>]*>6.3%</td>", html)
    assert "remedy: clean up old checkpoints" in html
    md = tmp_path / "pf.md"
    assert cli("report", str(tmp_path / "pf.json"), "--markdown", str(md)).exit_code == 0
    assert "— **FAIL**" in md.read_text() and (tmp_path / "pf-1.png").read_bytes().startswith(PNG_MAGIC)


# -- bad input ------------------------------------------------------------------------------------------------


BAD_DOCUMENTS = {
    "not-json": ("{not json", "not JSON"),
    "array": ([1, 2], "not a ckptbench result (a JSON list, not an object)"),
    "no-schema": ({"target": "/x"}, "not a ckptbench result (no 'schema' string)"),
    "unknown-name": ({"schema": "ckptbench.foo/1"}, "unknown schema 'ckptbench.foo/1'"),
    "unknown-version": ({"schema": "ckptbench.bench.fs/2"},
                        "schema 'ckptbench.bench.fs/2' is a version ckptbench 0.1.0 cannot read "
                        "(it reads ckptbench.bench.fs/1)"),
    "malformed": ({"schema": "ckptbench.bench.fs/1", "environment": {}, "target": "/x"},
                  "not a well-formed ckptbench.bench.fs/1 document (no 'spec')"),
}


@pytest.mark.parametrize("name", sorted(BAD_DOCUMENTS))
@pytest.mark.parametrize("fmt", ["--html", "--markdown"])
def test_bad_input_one_line_exit_2_nothing_written(cli, tmp_path: Path, name: str, fmt: str):
    content, message = BAD_DOCUMENTS[name]
    bad = _write(tmp_path / f"{name}.json", content)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    # A good file first: the bad one must still stop everything before a byte is written.
    result = cli("report", str(FS_RESULT), str(bad), fmt, str(out_dir / "r.out"))
    line = _one_error_line(result)
    assert f"{bad}: {message}" in line
    assert result.stdout == "" and list(out_dir.iterdir()) == []


def test_missing_file_and_directory(cli, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _one_error_line(cli("report", str(FS_RESULT), "nope.json"))
    assert "result file 'nope.json' does not exist" in line
    line = _one_error_line(cli("report", str(tmp_path)))
    assert "is a directory" in line
    line = _one_error_line(cli("report", "a\nb.json"))  # named quoted and escaped: still one line
    assert "'a\\nb.json' does not exist" in line
    assert list(tmp_path.iterdir()) == []
    assert "Missing argument" in _one_error_line(cli("report"))


def test_bad_output_paths(cli, tmp_path: Path):
    line = _one_error_line(cli("report", str(FS_RESULT), "--html", str(tmp_path / "no" / "r.html")))
    assert "does not exist" in line
    copy = _write(tmp_path / "fs.json", FS_RESULT.read_text())
    before = copy.read_text()
    line = _one_error_line(cli("report", str(copy), "--html", str(copy)))
    assert "one of the result files" in line and copy.read_text() == before
    line = _one_error_line(cli("report", str(copy), "--html", str(tmp_path / "x"), "--markdown", str(tmp_path / "x")))
    assert "same file" in line


def test_skip_unknown(cli, tmp_path: Path):
    unknown = _write(tmp_path / "other.json", {"schema": "ckptbench.perf.fio_compare/1"})
    out = tmp_path / "r.html"
    result = cli("report", str(FS_RESULT), str(unknown), "--skip-unknown", "--html", str(out))
    assert result.exit_code == 0, result.stderr
    assert result.stderr.strip() == f"warning: skipped {unknown}: unknown schema 'ckptbench.perf.fio_compare/1'"
    assert "1 result file" in result.stdout and out.exists()
    # Skipping does not excuse a broken file, and skipping everything leaves nothing to report.
    assert "not JSON" in _one_error_line(cli("report", str(_write(tmp_path / "b.json", "[")), "--skip-unknown"))
    result = cli("report", str(unknown), "--skip-unknown", "--html", str(tmp_path / "n.html"))
    assert result.exit_code == 2 and result.stderr.splitlines()[0].startswith("warning: skipped")
    assert result.stderr.splitlines()[1:] == ["ckptbench: error: no result file of a schema ckptbench reports on "
                                              "(see 'ckptbench report --help')"]
    assert not (tmp_path / "n.html").exists()


def test_preflight_result_renders(cli, tmp_path: Path):
    """A real (tiny) preflight result: its section, the checks table and the waste curve."""
    result = cli("preflight", str(tmp_path), "--measure-size", "16MiB", "--measure-time", "0", "--repeat", "1", "--params", "100M",
                 "--ranks", "1", "--mtbf", "1d", "--json")
    assert result.exit_code in (0, 1), result.stderr
    source = tmp_path / "preflight.json"
    source.write_text(result.stdout)
    out = tmp_path / "r.html"
    assert cli("report", str(source), "--html", str(out)).exit_code == 0
    html = out.read_text()
    assert "Pre-flight:" in html and "checkpoint-time" in html and "recommendation" in html
    assert html.count("data:image/png;base64,") >= 1


def test_compare_reference_run_renders(cli, tmp_path: Path):
    source = Path(__file__).resolve().parents[2] / "results" / "compare-vm-20261126T071623.json"
    out = tmp_path / "c.html"
    assert cli("report", str(source), "--html", str(out)).exit_code == 0
    html = out.read_text()
    assert "Tier comparison: /var/tmp" in html and "fuse.ceph-fuse" in html


def _mutated(source: Path, path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """``source``'s document with the value at ``path`` replaced (the JSON stays valid)."""
    document = _load(source)
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return document


PREFLIGHT_RESULT = RESULTS / "preflight-vm-20261126T071318.json"
DISTRIBUTED_RESULT = RESULTS / "bench-distributed-vm-20261126T110824.json"
MALFORMED = {
    "goal-description-null": (CKPT_RESULT, ("goals", 0, "description"), None, "table 'ratios': None where text belongs"),
    "durable-a-number": (CKPT_RESULT, ("results", 0, "durable"), 5, "5 where text belongs"),
    "reason-null": (PREFLIGHT_RESULT, ("recommendation", 0, "reason"), None, "None where text belongs"),
    "stall-too-big": (CKPT_RESULT, ("async", 0, "stall_s"), 10**400, "int too large to convert to float"),
    "rate-too-big": (DISTRIBUTED_RESULT, ("summary", "load", "gbps", "median"), 10**400, "too large to convert"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_value_is_one_line_naming_the_file(cli, tmp_path: Path, name: str):
    """Valid JSON with a value of the wrong kind, where a table cell, a duration or a rate is made from it."""
    source, path, value, message = MALFORMED[name]
    bad = _write(tmp_path / f"{name}.json", _mutated(source, path, value))
    out = tmp_path / "r.html"
    line = _one_error_line(cli("report", str(bad), "--html", str(out)))
    assert f"{bad}: not a well-formed " in line and message in line
    assert not out.exists()


@pytest.mark.parametrize("constant", ["Infinity", "-Infinity", "NaN"])
def test_non_finite_numbers_are_not_json(cli, tmp_path: Path, constant: str):
    text = json.dumps(_mutated(CKPT_RESULT, ("async", 0, "stall_s"), 0.5)).replace("0.5", constant, 1)
    bad = _write(tmp_path / "inf.json", text)
    line = _one_error_line(cli("report", str(bad), "--html", str(tmp_path / "r.html")))
    assert f"{bad}: not JSON ({constant} is not a JSON number)" in line


def test_deeply_nested_json_is_one_line(cli, tmp_path: Path):
    bad = _write(tmp_path / "deep.json", "[" * 100_000 + "]" * 100_000)
    line = _one_error_line(cli("report", str(bad), "--html", str(tmp_path / "r.html")))
    assert f"{bad}: not a ckptbench result (JSON nested too deeply to read)" in line
    nested = _write(tmp_path / "nested.json", '{"schema": "ckptbench.bench.fs/1", "x": ' + "[" * 900 + "]" * 900 + "}")
    assert "nested.json: " in _one_error_line(cli("report", str(nested), "--html", str(tmp_path / "r.html")))

"""``--format table|json|csv`` on every command: the option everywhere, ``--json`` its alias, CSV that the csv
module reads with the documented columns, one row per configuration, writer or tier."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from ckptbench.bench.rows import COLUMNS
from ckptbench.cli import COMMANDS

RESULTS = Path(__file__).resolve().parents[2] / "results"
CKPT_RESULT = RESULTS / "bench-checkpoint-vm-20261126T055124.json"
COMPARE_RESULT = RESULTS / "compare-vm-20261126T071623.json"
PREFLIGHT_RESULT = RESULTS / "preflight-vm-20261126T071318.json"
FS_RESULT = RESULTS / "bench-vm-20261126T042848.json"

#: The documented header of a result's CSV (docs/FORMATS.md): renaming a column breaks users' scripts.
HEADER = (
    "schema,source,target,configuration,writer,tier,threads,block_size_bytes,schedule,object_size_bytes,concurrency,"
    "part_size_bytes,ranks,bytes_per_run,runs,leader,write_gbps,write_gbps_min,write_gbps_max,write_gbps_stdev,"
    "read_gbps,read_gbps_min,read_gbps_max,read_gbps_stdev,save_gbps,save_gbps_min,save_gbps_max,save_gbps_stdev,"
    "load_gbps,load_gbps_min,load_gbps_max,load_gbps_stdev,stall_s,stall_s_min,stall_s_max,stall_s_stdev,persist_s,"
    "persist_s_min,persist_s_max,persist_s_stdev,interference,interference_min,interference_max,interference_stdev"
)
DOCUMENTED = HEADER.split(",")

INTERVAL = ("interval", "--size", "140GB", "--bandwidth", "1GB/s", "--mtbf", "3h", "--restart", "10m", "--every", "1h")
GOODPUT = ("goodput", "--params", "100B", "--tokens", "20T", "--gpus", "4000", "--peak-tflops", "989", "--mfu", "0.35",
           "--node-hour-cost", "90", "--faults-per-day", "1", "--detect", "60m", "--replace", "60m", "--resume", "30m")


def _csv(text: str) -> list[dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text))
    found = list(reader)
    assert reader.fieldnames, text
    return found


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_takes_format_and_json(cli, command):
    out = cli(command, "--help")
    assert out.exit_code == 0, out.stderr
    assert "--format [table|json|csv]" in out.stdout
    assert "--json" in out.stdout


def test_result_columns_are_the_documented_ones():
    assert list(COLUMNS) == DOCUMENTED


def test_bench_csv_has_one_row_per_configuration(cli, tmp_path):
    out = cli("bench", str(tmp_path), "--size", "2MiB", "--files", "1", "--threads", "1,2", "--block-size", "1MiB",
              "--repeat", "2", "--warmup", "0", "--no-read", "--format", "csv")
    assert out.exit_code == 0, out.stderr
    header = out.stdout.splitlines()[0].split(",")
    assert header == DOCUMENTED
    found = _csv(out.stdout)
    assert [(r["threads"], r["block_size_bytes"]) for r in found] == [("1", str(2**20)), ("2", str(2**20))]
    for row in found:
        assert row["schema"] == "ckptbench.bench.fs/1" and row["runs"] == "2"
        assert float(row["write_gbps_min"]) <= float(row["write_gbps"]) <= float(row["write_gbps_max"])
        assert row["read_gbps"] == ""  # --no-read: empty, the column stays
    assert list(tmp_path.iterdir()) == []  # scratch removed as with every format


def test_report_csv_gives_a_row_per_writer_and_tier_and_writes_no_report(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = cli("report", str(CKPT_RESULT), str(COMPARE_RESULT), "--format", "csv")
    assert out.exit_code == 0, out.stderr
    found = _csv(out.stdout)
    ckpt = json.loads(CKPT_RESULT.read_text())
    compare = json.loads(COMPARE_RESULT.read_text())
    writers = [r for r in found if r["schema"] == "ckptbench.bench.checkpoint/1"]
    tiers = [r for r in found if r["schema"] == "ckptbench.compare/1"]
    assert [r["writer"] for r in writers] == [r["writer"] for r in ckpt["results"]]
    assert [r["configuration"] for r in tiers] == [t["label"] for t in compare["tiers"]]
    first = ckpt["results"][0]["save"]
    assert float(writers[0]["save_gbps"]) == pytest.approx(first["summary_gbps"]["median"])
    assert float(writers[0]["save_gbps_max"]) == pytest.approx(first["summary_gbps"]["max"])
    assert list(tmp_path.iterdir()) == []  # no report.html when only rows were asked for


def test_report_json_rows_match_its_csv(cli):
    as_json = cli("report", str(FS_RESULT), str(PREFLIGHT_RESULT), "--format", "json")
    as_csv = cli("report", str(FS_RESULT), str(PREFLIGHT_RESULT), "--format", "csv")
    assert as_json.exit_code == as_csv.exit_code == 0
    doc = json.loads(as_json.stdout)
    assert doc["columns"] == DOCUMENTED
    rows = _csv(as_csv.stdout)
    assert len(rows) == len(doc["rows"]) == len(json.loads(FS_RESULT.read_text())["results"]) + 1
    assert rows[-1]["schema"] == "ckptbench.preflight/1" and float(rows[-1]["save_gbps"]) > 0


@pytest.mark.parametrize("args", [INTERVAL, GOODPUT], ids=["interval", "goodput"])
def test_json_is_an_alias_of_format_json(cli, args):
    alias, named = cli(*args, "--json"), cli(*args, "--format", "json")
    assert alias.exit_code == named.exit_code == 0
    assert json.loads(alias.stdout) == json.loads(named.stdout)


def test_interval_csv_one_row_per_interval(cli):
    out = cli(*INTERVAL, "--format", "csv")
    assert out.exit_code == 0, out.stderr
    found = {r["interval"]: r for r in _csv(out.stdout)}
    doc = cli.json(*INTERVAL)
    assert set(found) == {"young", "daly", "optimum", "recommended", "yours"}
    assert float(found["optimum"]["interval_s"]) == pytest.approx(doc["optimal_interval_s"])
    assert float(found["yours"]["waste_fraction"]) == pytest.approx(doc["waste_fraction_at_interval"])


def test_interval_csv_gives_the_overhead_the_table_shows_for_young_and_daly(cli):
    """Every row the table prints with a checkpoint overhead has it in the CSV as well."""
    found = {r["interval"]: r for r in _csv(cli(*INTERVAL, "--format", "csv").stdout)}
    table = cli(*INTERVAL).stdout
    for name, label in (("young", "Young"), ("daly", "Daly (2006)")):
        overhead = float(found[name]["overhead_fraction"])
        row = next(line for line in table.splitlines() if label in line)
        assert row.rstrip(" │").endswith(f"{100 * overhead:.2f} %"), (row, overhead)


def test_goodput_csv_one_row_per_scenario(cli):
    out = cli(*GOODPUT, "--format", "csv")
    assert out.exit_code == 0, out.stderr
    found = _csv(out.stdout)
    doc = cli.json(*GOODPUT)
    assert [r["scenario"] for r in found] == ["as_given", *(w["name"] for w in doc["what_if"])]
    assert float(found[0]["goodput"]) == pytest.approx(doc["goodput"])


def test_recommend_csv_one_row_per_setting(cli):
    out = cli("recommend", str(FS_RESULT), "--format", "csv")
    assert out.exit_code == 0, out.stderr
    doc = cli.json("recommend", str(FS_RESULT))
    assert [r["setting"] for r in _csv(out.stdout)] == list(doc["settings"])


def test_json_and_another_format_is_refused_in_one_line(cli):
    out = cli(*INTERVAL, "--json", "--format", "csv")
    assert out.exit_code == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1 and "--json and --format csv" in out.stderr


def test_a_bad_format_is_refused(cli):
    out = cli(*INTERVAL, "--format", "xml")
    assert out.exit_code == 2
    assert out.stderr.count("\n") == 1 and "xml" in out.stderr


def test_format_in_a_config_file(cli, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[interval]\nformat = "csv"\n')
    out = cli("--config", str(config), *INTERVAL)
    assert out.exit_code == 0, out.stderr
    assert out.stdout.startswith("interval,interval_s,")


def test_object_sweep_rows_name_object_size_concurrency_and_part():
    from ckptbench.bench.rows import rows

    record = {"config": {"object_size_bytes": 64 * 2**20, "objects": 4, "concurrency": 8,
                         "part_size_bytes": 16 * 2**20, "parts_per_object": 4},
              "write": {"runs_gbps": [0.5, 0.6], "bytes_per_run": 2**28}, "read": {"runs_gbps": [0.9, 1.0]}}
    (row,) = rows({"schema": "ckptbench.bench.objects/1", "target": "s3://b/p", "results": [record], "leaders": [0]})
    columns = row.columns()
    assert columns["configuration"] == "64 MiB objects x 8 in flight, 16 MiB parts"
    assert (columns["object_size_bytes"], columns["concurrency"], columns["part_size_bytes"]) == (2**26, 8, 2**24)
    assert columns["read_gbps"] == pytest.approx(0.95) and columns["runs"] == 2 and columns["leader"] is True

"""The report and the tables read as people read: like compared with like in the overview, one row per tier
or configuration; no development goals shown as missed; fractions as percent, money as dollars; spreads only
from enough runs; "1 run"; one style of interval axis; the waste plot's dot at the optimum it names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ckptbench import units
from ckptbench.report import preflight_plot, report_plots, waste_plot
from ckptbench.report.document import format_value

RESULTS = Path(__file__).resolve().parents[2] / "results"
SHOOTOUTS = sorted(RESULTS.glob("bench-checkpoint-vm-*.json"))
COMPARE = RESULTS / "compare-vm-20261126T071623.json"
PREFLIGHT = RESULTS / "preflight-vm-20261126T071318.json"


def _overview(markdown: str) -> str:
    return markdown.split("## Tier comparison", 1)[1].split("\n## ", 1)[0]


def test_overview_has_one_row_per_place_and_configuration_and_includes_compare_tiers(cli, tmp_path):
    assert len(SHOOTOUTS) >= 3  # the same target measured several times
    out = tmp_path / "r.md"
    result = cli("report", *map(str, SHOOTOUTS), str(COMPARE), "--markdown", str(out))
    assert result.exit_code == 0, result.stderr
    overview = _overview(out.read_text())
    rows = [line for line in overview.splitlines() if line.startswith("| ") and "place" not in line]
    newest = max(SHOOTOUTS, key=lambda p: json.loads(p.read_text())["created"])
    shootout_rows = [r for r in rows if "| ckptbench |" in r.replace("*", "")]
    assert len(shootout_rows) == 1 and newest.name in shootout_rows[0]
    tiers = json.loads(COMPARE.read_text())["tiers"]
    assert sum("ckptbench (compare tier)" in r for r in rows) == len(tiers)
    assert f"{len(SHOOTOUTS) - 1} older result files about the same place left out" in overview


def test_development_goals_are_not_shown_as_met_or_missed(cli, tmp_path):
    out = tmp_path / "r.md"
    assert cli("report", str(SHOOTOUTS[0]), "--markdown", str(out)).exit_code == 0
    text = out.read_text()
    assert "MISSED" not in text and "| met |" not in text and "**ratios**" in text


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("goodput", 0.9986, "99.9%"),
    ("interference", 0.096, "9.6%"),
    ("waste_fraction_sync_optimum", 0.0029, "0.29%"),
    ("wasted_usd_per_day", 1075.2, "$1,075 per day"),
    ("total_cost_usd", 22_052_412.0, "$22.05M"),
    ("wasted_gpu_hours_per_day", 2.142, "2.14 h per day"),
    ("failures_per_day", 0.0303, "0.0303 per day"),
])
def test_values_are_formatted_for_people(key, value, shown):
    assert format_value(key, value) == shown


def test_runs_grammar_and_spreads_need_enough_runs():
    assert units.runs_text(1, 0) == "1 run (no warm-up)"
    assert units.runs_text(3, 1) == "3 runs (+1 warm-up)"
    two = {"n": 2, "min": 1.0, "max": 2.0, "p10": 1.1, "p90": 1.9}
    assert units.range_text(two) == "-" and units.percentiles_text(two) == "-"
    three = {**two, "n": 3}
    assert units.range_text(three) == "1.00–2.00" and units.percentiles_text(three) == "-"
    assert units.percentiles_text({**two, "n": 10}) == "1.10/1.90"


def test_a_single_run_shows_no_range_in_the_table(cli, tmp_path):
    out = cli("bench", str(tmp_path), "--size", "2MiB", "--files", "1", "--threads", "1", "--block-size", "1MiB",
              "--repeat", "1", "--warmup", "0", "--no-read")
    assert out.exit_code == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "1 run (no warm-up)" in text and "runs (+" not in text and "in 1 file per run" in text
    assert not re.search(r"\d\.\d\d–\d\.\d\d", out.stdout)  # no min–max from one sample


def test_the_waste_dot_is_at_the_optimum_it_names():
    seconds = [100.0, 1000.0, 10000.0]
    waste = [5.0, 1.0, 4.0]
    x, y = report_plots.waste_dot(seconds, waste, {"interval": 2000.0, "optimal interval": 3000.0})
    assert x == 3000.0 and 1.0 < y < 4.0  # on the curve between the samples around it, not the lowest sample
    assert report_plots.waste_dot(seconds, waste, {"interval": 2000.0}) == (1000.0, 1.0)


def test_every_interval_plot_uses_the_one_axis_style(monkeypatch, tmp_path):
    called = []
    for module in (report_plots, waste_plot, preflight_plot):
        monkeypatch.setattr(module, "interval_axis", lambda ax, _m=module: called.append(_m.__name__))
    preflight = json.loads(PREFLIGHT.read_text())
    preflight_plot.plot_waste_curve(preflight, tmp_path / "a.png")
    report_plots.plot_waste_points(preflight, preflight["model"]["curve"], {"optimal interval": 3955.0}, tmp_path / "b.png")
    from ckptbench.model.interval import CheckpointCost

    waste_plot.plot_waste_curve(tmp_path / "c.png", CheckpointCost.sync(140.0), 10800.0, 600.0,
                           {"optimal_interval_s": 1647.0, "young_interval_s": 1739.0, "daly_interval_s": 1647.0})
    assert sorted(called) == sorted(m.__name__ for m in (report_plots, waste_plot, preflight_plot))


def test_predictions_carry_their_ranges_in_the_report(cli, tmp_path):
    """Every prediction the report prints shows its range next to the point: preflight's and compare's."""
    preflight, compare = RESULTS / "preflight-h200-20261127T155446.json", RESULTS / "compare-vm-20261127T132749.json"
    out = tmp_path / "r.md"
    assert cli("report", str(preflight), str(compare), "--markdown", str(out)).exit_code == 0, out
    text = out.read_text()
    p = json.loads(preflight.read_text())["predictions"]
    low, high = (units.format_duration(v) for v in p["sync_checkpoint_s_range"])
    row = next(line for line in text.splitlines() if line.startswith("| sync checkpoint |"))
    assert f"{units.format_duration(p['sync_checkpoint_s'])} ({low}–{high})" in row
    tier = json.loads(compare.read_text())["tiers"][0]
    low, high = (format_value("waste_fraction", v) for v in tier["model_range"]["waste_fraction"])
    row = next(line for line in text.splitlines() if line.startswith("| waste at optimum, job |"))
    assert f"{format_value('waste_fraction', tier['model']['waste_fraction'])} ({low}–{high})" in row


@pytest.mark.parametrize(("span", "shown"), [
    (None, "1.5 s"), ([1.5, 1.5], "1.5 s"), ([1.0, 2.0], "1.5 s (1 s–2 s)"), ([1.0, None], "1.5 s (1 s–?)"),
])
def test_a_range_is_shown_only_where_it_says_something(span, shown):
    from ckptbench.report.document import format_ranged

    assert format_ranged("x_s", 1.5, span) == shown


def test_check_ranges_read_in_the_checks_unit(cli, tmp_path):
    preflight = RESULTS / "preflight-h200-20261127T155446.json"
    out = tmp_path / "r.md"
    assert cli("report", str(preflight), "--markdown", str(out)).exit_code == 0
    check = next(c for c in json.loads(preflight.read_text())["checks"] if c["name"] == "checkpoint-time")
    low, high = (units.format_duration(v) for v in check["value_range"])
    row = next(line for line in out.read_text().splitlines() if line.startswith("| checkpoint-time |"))
    assert f"| {low}–{high} |" in row and "e+09" not in out.read_text()

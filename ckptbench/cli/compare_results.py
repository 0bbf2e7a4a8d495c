"""``ckptbench compare-results OLD.json NEW.json``: a result against a baseline, metric by metric, with the
uncertainty from the runs; ``--fail-if-slower`` makes it a CI gate."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from ckptbench.cli import params
from ckptbench.cli.formats import emit, format_options
from ckptbench.cli.options import read_result
from ckptbench.units import format_duration

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

#: metric -> (what the table calls it, how a value is shown)
_SHOWN: dict[str, tuple[str, Any]] = {
    "write_gbps": ("write GB/s", lambda v: f"{v:.2f}"),
    "read_gbps": ("read GB/s", lambda v: f"{v:.2f}"),
    "save_gbps": ("save GB/s", lambda v: f"{v:.2f}"),
    "load_gbps": ("load GB/s", lambda v: f"{v:.2f}"),
    "stall_s": ("async stall", format_duration),
    "persist_s": ("async persist", format_duration),
    "interference": ("interference", lambda v: f"{v:.0%}"),
}

#: ``--format csv``: one row per configuration and metric.
CSV_COLUMNS = ("configuration", "metric", "higher_is_better", "old_median", "old_runs", "new_median", "new_runs",
               "ratio", "ratio_error", "verdict", "slower_by", "regression")


@click.command("compare-results", context_settings=_CONTEXT)
@click.argument("old", type=params.RESULT_FILE, metavar="OLD.json")
@click.argument("new", type=params.RESULT_FILE, metavar="NEW.json")
@click.option("--fail-if-slower", "threshold", type=params.FRACTION, default=None, metavar="PERCENT",
              help="Exit 1 when a rate's median is more than this below OLD's, or a time's (async stall, persist) "
                   "more than this above: 10% or 0.1. For CI.")
@format_options
def compare_results(old: Path, new: Path, threshold: float | None, output_format: str) -> None:
    """Compare NEW.json with OLD.json (two results of the same kind: `bench`, `compare` or `preflight`),
    configuration by configuration (threads x block size, writer, tier), metric by metric.

    Each line reads "NEW is 1.80 ± 0.20x OLD": the ratio of the medians, ± its uncertainty propagated
    from both sides' runs (relative standard deviations, as hyperfine does); a side with a single run
    adds none, and the line says so. A change is "beyond the noise" when every run of one side beats
    every run of the other (the tie rule of `bench` and `compare`); with a single run on either side
    it is "unknown".

    Exit status: 0, or 1 when --fail-if-slower is given and a median is worse than it (each regression
    named), or 2 when a file is not a result of a kind this version reads, the two are of different
    kinds, or they have no configuration in common.

    \b
    Examples:
      ckptbench compare-results baseline.json results/bench-vm-20261127T101010.json
      ckptbench compare-results old.json new.json --fail-if-slower 10%
      ckptbench compare-results old.json new.json --format csv > changes.csv
    """
    from ckptbench.bench.baseline import compare

    old_doc, new_doc = read_result(old), read_result(new)
    comparison = compare(old_doc, new_doc, str(old), str(new))
    regressions = comparison.regressions(threshold) if threshold is not None else []
    document = {
        "schema": "ckptbench.compare-results/1", "old": str(old), "new": str(new), "kind": comparison.kind,
        "fail_if_slower": threshold,
        "changes": [c.to_dict(threshold) for c in comparison.changes],
        "regressions": [f"{c.configuration}: {c.metric}" for c in regressions],
        "only_old": list(comparison.only_old), "only_new": list(comparison.only_new),
        # writers a shoot-out left out because they failed there (bench --workload checkpoint): why one is
        # only in the other file
        "failed_old": _failed_writers(old_doc), "failed_new": _failed_writers(new_doc),
        "units": {"ratio": "median(NEW) / median(OLD)", "ratio_error": "standard uncertainty of the ratio",
                  "slower_by": "fraction: 1 - ratio for rates, ratio - 1 for times"},
    }
    emit(document, output_format, _print, lambda doc: (CSV_COLUMNS, doc["changes"]))
    if regressions:  # on stderr in every format: a CI log shows why the step failed
        worst = max(regressions, key=lambda c: c.slower_by() or 0.0)
        click.secho(f"ckptbench: {len(regressions)} regression{'s' if len(regressions) != 1 else ''} past "
                    f"{threshold:.0%}: {', '.join(document['regressions'])} (worst: {worst.configuration} "
                    f"{worst.metric} {worst.slower_by():.0%} slower)", fg="red", err=True)
        click.get_current_context().exit(1)


def _ratio_text(change: dict[str, Any]) -> str:
    if change["ratio"] is None:
        return "NEW is - (OLD is 0)"
    error = change["ratio_error"]
    spread = f" ± {error:.2f}" if error else ""
    return f"NEW is {change['ratio']:.2f}{spread}x OLD"


def _print(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from ckptbench.cli.render import stdout_console

    console = stdout_console()
    console.print(f"[bold]OLD[/] {doc['old']}  [bold]NEW[/] {doc['new']}  ({doc['kind']})")
    table = Table(header_style="bold")
    for name, justify in (("configuration", "left"), ("metric", "left"), ("OLD", "right"), ("NEW", "right"),
                          ("NEW vs OLD", "right"), ("change", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for c in doc["changes"]:
        label, show = _SHOWN[c["metric"]]
        verdict = c["verdict"]
        better = "higher" if c["higher_is_better"] else "lower"
        runs = f"{c['old_runs']} vs {c['new_runs']} runs"
        single = [side for side, n in (("OLD", c["old_runs"]), ("NEW", c["new_runs"])) if n < 2]
        if verdict == "unknown":
            text = f"[yellow]cannot tell: {' and '.join(single)} had a single run[/] ({runs})"
        elif verdict == "within the noise":
            text = f"within the noise ({runs} overlap)"
        else:
            colour = "green" if verdict == "better" else "red"
            text = f"[{colour}]{verdict}[/] ({better} is better), beyond the noise ({runs})"
        if c["regression"]:
            text = f"[bold red]REGRESSION[/] {text}"
        table.add_row(c["configuration"], label, show(c["old_median"]), show(c["new_median"]), _ratio_text(c), text)
    console.print(table)
    for side, labels, other, failed in (("OLD", doc["only_old"], "NEW", doc.get("failed_new") or {}),
                                        ("NEW", doc["only_new"], "OLD", doc.get("failed_old") or {})):
        if labels:
            console.print(f"[dim]only in {side}: {', '.join(labels)}[/]")
        for writer, error in failed.items():
            console.print(f"[yellow]{writer} failed in {other}[/] [dim]({error})[/]")
    threshold = doc["fail_if_slower"]
    if threshold is not None and not doc["regressions"]:
        slowest = max((c["slower_by"] for c in doc["changes"] if c["slower_by"] is not None), default=math.nan)
        worst = f"; the slowest change is {slowest:.0%}" if math.isfinite(slowest) and slowest > 0 else ""
        console.print(f"no metric slower than OLD by more than {threshold:.0%}{worst}")


def _failed_writers(doc: Any) -> dict[str, str]:
    """writer -> its error, for the writers a shoot-out result says failed (none in other results)."""
    failed = doc.get("failed_writers") if isinstance(doc, dict) else None
    if not isinstance(failed, list):
        return {}
    return {str(f.get("writer")): str(f.get("error")) for f in failed if isinstance(f, dict)}

"""``ckptbench report RESULT.json ...``: one self-contained HTML (or Markdown) report from result files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ckptbench.cli import params
from ckptbench.cli.formats import emit, format_options
from ckptbench.errors import UsageError

DEFAULT_HTML = Path("report.html")
DEFAULT_TITLE = "ckptbench report"


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("results", nargs=-1, required=True, metavar="RESULT.json...",
                type=params.RESULT_FILE)
@click.option("--html", "html_path", type=params.OUTPUT_FILE_OR_DASH, default=None,
              help=f"Write one self-contained HTML file here ('-': stdout)  [default: {DEFAULT_HTML} when "
                   "--markdown is not given].")
@click.option("--markdown", "markdown_path", type=params.OUTPUT_FILE, default=None,
              help="Write GitHub Markdown here, its figures next to it as STEM-1.png, STEM-2.png...")
@click.option("--title", default=DEFAULT_TITLE, show_default=True, help="The report's heading.")
@click.option("--skip-unknown", is_flag=True,
              help="Leave out result files of a schema this ckptbench does not report on (with a warning) "
                   "instead of failing: handy with results/*.json.")
@format_options
def report(results: tuple[Path, ...], html_path: Path | None, markdown_path: Path | None, title: str,
           skip_unknown: bool, output_format: str) -> None:
    """Build a report from result files of `ckptbench bench` (--output DIR or --json): for each file, where
    it was measured (host, CPU, kernel, filesystem or endpoint), the tables, the plots and the warnings
    with their remedies; with two or more, a tier comparison of their best write and read rates first.

    \b
    Reports on:
      ckptbench.bench.fs/1          filesystem sweep: table, bars, threads x block-size heat map
      ckptbench.bench.objects/1     s3:// sweep: table, bars, in-flight x object-size heat map
      ckptbench.bench.checkpoint/1  writer shoot-out: save/load, async stall/persist, memory, goals
      ckptbench.preflight/1         pre-flight: job, predictions, checks, recommendation, waste curve
      ckptbench.compare/1           tiers side by side: measured rates and the job's model per tier

    In any result file, a `checks` list with a `verdict` becomes a checks table and a `model.curve` a
    waste-versus-interval plot. Any other schema, or another version of these, is refused: exit 2,
    one line naming the file, nothing written (see --skip-unknown).

    Without --html or --markdown the report is written to ./report.html; give both to get both.
    --format json or csv prints every file's rows instead (one per configuration, writer or tier, the
    overview's numbers with their runs) and writes a report only where --html or --markdown asks.
    Every input is read and every figure drawn before any file is written. The HTML has its CSS
    inline and its figures as data: URIs: no script, no external URL, readable offline and by mail.

    \b
    Examples:
      ckptbench report results/bench-vm-20261126T042848.json
      ckptbench report nvme.json cephfs.json s3.json --html tiers.html --title "Storage for run 42"
      ckptbench report results/*.json --skip-unknown --markdown docs/storage.md
      ckptbench report sweep.json --html - > sweep.html
    """
    from ckptbench.report.html import write_html, write_markdown
    from ckptbench.report.sections import build_report, read_result, renderer_for

    if output_format != "table" and html_path is not None and str(html_path) == "-":
        raise UsageError(f"--html - and --format {output_format} both write to standard output", hint="give one")
    if html_path is None and markdown_path is None and output_format == "table":
        html_path = _default_html()
    outputs = {"--html": html_path, "--markdown": markdown_path}
    _check_outputs(outputs, results)

    documents: list[tuple[str, dict[str, Any]]] = []
    for path in results:
        document = read_result(path)
        try:
            renderer_for(str(path), document)
        except UsageError as exc:
            if not skip_unknown:
                raise
            click.secho(f"warning: skipped {exc.args[0]}", fg="yellow", err=True)
            continue
        documents.append((str(path), document))
    if not documents:
        raise UsageError("no result file of a schema ckptbench reports on", hint="see 'ckptbench report --help'")
    if output_format != "table":
        _emit_rows(documents, output_format)
        if html_path is None and markdown_path is None:
            return
    built = build_report(documents, title=title)

    figures = len(built.figures)
    summary = f"{len(built.documents)} result file{'s' if len(built.documents) != 1 else ''}, {figures} figures"
    to_stdout = html_path is not None and str(html_path) == "-"
    if html_path is not None:
        if to_stdout:
            from ckptbench.report.html import render_html

            sys.stdout.write(render_html(built))
        else:
            write_html(built, html_path)
            click.echo(f"report: {html_path} ({summary})")
    if markdown_path is not None:
        written = write_markdown(built, markdown_path)
        pngs = f", figures {written[1].name}..{written[-1].name}" if len(written) > 1 else ""
        click.echo(f"report: {markdown_path} ({summary}{pngs})", err=to_stdout)  # stdout may hold the HTML


def _emit_rows(documents: list[tuple[str, dict[str, Any]]], output_format: str) -> None:
    """Every file's rows (``bench.rows``) as one CSV, or as a JSON document ``ckptbench.rows/1``."""
    from ckptbench.bench.rows import COLUMNS, rows

    found = [row.columns() for where, document in documents for row in rows(document, where)]
    document = {"schema": "ckptbench.rows/1", "columns": list(COLUMNS), "rows": found}
    emit(document, output_format, lambda doc: None, lambda doc: (COLUMNS, doc["rows"]))


def _default_html() -> Path:
    """./report.html, checked like a --html given on the command line."""
    try:
        return params.check_output_file(str(DEFAULT_HTML))
    except UsageError as exc:
        raise UsageError(f"the default --html {exc.args[0]}", hint="give --html FILE or --markdown FILE") from None


def _check_outputs(outputs: dict[str, Path | None], inputs: tuple[Path, ...]) -> None:
    """Fail before reading anything if an output would replace an input (each was checked to be writable
    when its flag was read)."""
    if str(outputs.get("--markdown")) == "-":
        raise UsageError("--markdown cannot write to standard output: its figures are PNG files beside it",
                         hint="give --markdown FILE.md, or --html - for standard output")
    given = {flag: path for flag, path in outputs.items() if path is not None and str(path) != "-"}
    sources = {p.resolve() for p in inputs}
    for flag, path in given.items():
        if path.resolve() in sources:
            raise UsageError(f"{flag} {params.shown_path(path)} is one of the result files: it would be overwritten")
    if len({p.resolve() for p in given.values()}) < len(given):
        raise UsageError("--html and --markdown name the same file")

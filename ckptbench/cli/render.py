"""Output shared by commands: the stdout console, progress bars, warnings on stderr, and the result
file of a measuring command (opened before the run, written after it, removed if it fails)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import click

from ckptbench import knobs
from ckptbench.bench.progress import Progress
from ckptbench.cli.formats import emit
from ckptbench.cli.params import shown_path
from ckptbench.errors import StorageIOError, UsageError
from ckptbench.model.tiers import CREDENTIAL_OPTIONS

#: Storage-option keys whose values are credentials: never echoed, never written to a result file
#: (the same list tier files are checked against).
SECRET_OPTIONS = CREDENTIAL_OPTIONS


def stdout_console() -> Any:
    """Rich console on stdout; when piped it keeps a table-friendly width instead of 80 columns."""
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=max(console.width, 140))
    return console


def stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


class RichProgress(Progress):
    """One bar over all bytes of a run; the description names the step in progress."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar
        self._task = bar.add_task("starting", total=None)
        self._completed = 0

    def begin(self, total_bytes: int) -> None:
        self._bar.update(self._task, total=total_bytes)

    def phase(self, description: str) -> None:
        self._bar.update(self._task, description=description)

    def advance(self, step_bytes: int) -> None:
        self._bar.update(self._task, completed=self._completed + step_bytes)

    def end_step(self, step_bytes: int) -> None:
        self._completed += step_bytes
        self._bar.update(self._task, completed=self._completed)


class LogProgress(Progress):
    """Progress for logs (Slurm, CI, a pipe): one line on stderr when a step starts and one when it ends,
    with what it moved and how fast, so a long run shows where it is and what it measured so far."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write
        self._step: str | None = None
        self._started = 0.0

    def phase(self, description: str) -> None:
        self._step, self._started = description, time.monotonic()
        self._write(f"ckptbench: {time.strftime('%H:%M:%S')} {description} ...")

    def end_step(self, step_bytes: int) -> None:
        if self._step is None:
            return
        from ckptbench.units import format_duration, format_rate, format_size

        seconds = time.monotonic() - self._started
        rate = f" ({format_rate(step_bytes / seconds)})" if step_bytes and seconds > 0 else ""
        moved = f"{format_size(step_bytes)} in " if step_bytes else ""
        self._write(f"ckptbench: {time.strftime('%H:%M:%S')} {self._step}: done, {moved}{format_duration(seconds)}"
                    f"{rate}")
        self._step = None


@contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Progress]:
    """A transient rich bar on stderr on a terminal; one line per step start and end otherwise (logs)."""
    console = stderr_console()
    if not enabled:
        yield Progress()
        return
    if not console.is_terminal:
        yield LogProgress(lambda line: click.echo(line, err=True)) if knobs.LOG_PROGRESS else Progress()
        return
    from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn
    from rich.progress import Progress as RichBar

    with RichBar(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=console, transient=True,
    ) as bar:
        yield RichProgress(bar)


def best_or_tied(labels: Sequence[str], leaders: Sequence[int], runs: int) -> str:
    """``best: X`` when one candidate beats the rest beyond the noise, else the tied ones, best median first."""
    if len(leaders) == 1:
        return f"best: [bold]{labels[leaders[0]]}[/]"
    why = ("one run each gives no spread to judge by: use --repeat 3 or more" if runs < 2
           else f"their {runs} runs overlap")
    return f"tied (no one beyond the noise; {why}): " + ", ".join(f"[bold]{labels[i]}[/]" for i in leaders)


def print_warnings(warnings: Sequence[dict[str, str]]) -> None:
    """Each warning as one yellow line on stderr, followed by its remedy."""
    for w in warnings:
        click.secho(f"warning: {w['message']}", fg="yellow", err=True)
        click.secho(f"  remedy: {w['remedy']}", fg="yellow", err=True)


def redacted_argv(argv: list[str]) -> list[str]:
    """The command line for a result file, with the values of credential storage options masked."""
    out, value_next = [], False
    for arg in argv:
        if value_next:
            out.append(_masked(arg))
        elif arg.startswith("--storage-option="):
            out.append("--storage-option=" + _masked(arg.partition("=")[2]))
        else:
            out.append(arg)
        value_next = arg == "--storage-option" and not value_next
    return out


def _masked(pair: str) -> str:
    key, sep, _ = pair.partition("=")
    return f"{key}=***" if sep and key.strip().lower() in SECRET_OPTIONS else pair


@dataclass
class ResultFile:
    """A result file opened before a run: :meth:`write` fills it afterwards, :meth:`discard` removes it
    and every directory :func:`open_output` created for it. The file is made and removed through one
    descriptor of its directory (``dir_fd``): a directory renamed or swapped for a symlink meanwhile cannot
    turn the removal onto another directory's file of the same name."""

    path: Path
    handle: IO[str]
    created_dirs: list[Path] = field(default_factory=list)  # deepest first
    dir_fd: int | None = None

    def write(self, text: str) -> None:
        try:
            with self.handle as fh:
                fh.write(text)
        finally:
            self._close_dir()

    def discard(self) -> None:
        self.handle.close()
        try:
            if self.dir_fd is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path.name, dir_fd=self.dir_fd)
            else:
                self.path.unlink(missing_ok=True)
        finally:
            self._close_dir()
        for directory in self.created_dirs:
            try:
                directory.rmdir()
            except OSError:  # something else was put there meanwhile: keep it
                break

    def _close_dir(self) -> None:
        fd, self.dir_fd = self.dir_fd, None
        if fd is not None:
            os.close(fd)


def open_output(output_dir: Path | None, prefix: str) -> ResultFile | None:
    """Create ``OUTPUT_DIR/PREFIX-HOST-STAMP.json`` before the run, so a bad --output fails in a second,
    not after an hour. Missing directories are created (and remembered, for :meth:`ResultFile.discard`)."""
    if output_dir is None:
        return None
    missing = []
    for directory in (output_dir, *output_dir.parents):
        if directory.exists():
            break
        missing.append(directory)
    dir_fd = None
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        path = output_dir / f"{prefix}-{socket.gethostname()}-{stamp}.json"
        dir_fd = os.open(output_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fd = os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                     dir_fd=dir_fd)
        return ResultFile(path, os.fdopen(fd, "w"), missing, dir_fd)
    except OSError as exc:
        if dir_fd is not None:
            os.close(dir_fd)
        for directory in missing:
            try:
                directory.rmdir()
            except OSError:
                break
        raise UsageError(f"--output {shown_path(output_dir)} cannot hold a result file: {exc.strerror}") from None


def run_and_emit(run: Callable[[Progress], Any], *, output: ResultFile | None, plot_path: Path | None,
                 output_format: str, plot: Callable[[dict[str, Any], Path], None],
                 print_tables: Callable[[Any, dict[str, Any]], None]) -> None:
    """Run a benchmark under a progress bar, then print it (``output_format``: tables, JSON or CSV), write the
    result file and the PNG.

    ``run(progress)`` returns a report with ``to_dict()``. The result file was opened before the run;
    it (and any directory made for it) is removed if the run fails or is interrupted before it is
    written. ``plot_path`` was checked when the flag was read (``params.OUTPUT_FILE``).
    """
    try:
        with progress_bar(enabled=True) as progress:
            report = run(progress)
        document = report.to_dict()
        document["argv"] = ["ckptbench", *redacted_argv(sys.argv[1:])]
        text = json.dumps(document, indent=2)
        # stdout first: a result file that cannot be written (disk full) must not take the numbers with it
        if output_format == "json":
            click.echo(text)
        else:
            emit(document, output_format, lambda doc: print_tables(report, doc))
        if output is not None:
            try:
                output.write(text + "\n")
            except OSError as exc:
                raise StorageIOError(f"result file {shown_path(output.path)} could not be written: "
                                     f"{exc.strerror}") from None
    except BaseException:
        if output is not None:
            output.discard()
        raise
    if plot_path is not None:
        try:
            plot(document, plot_path)
        except OSError as exc:
            raise StorageIOError(f"--plot {shown_path(plot_path)} could not be written: {exc.strerror}") from None
    if output_format == "table":
        if output is not None:
            click.echo(f"result: {_as_given(output.path)}")
        if plot_path is not None:
            click.echo(f"plot: {plot_path}")
    print_warnings(document["warnings"])


def _as_given(path: str | os.PathLike[str]) -> str:
    """``path`` relative to the working directory when it lies under it, else absolute (never ``../..``)."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute)
    return absolute if relative == os.pardir or relative.startswith(os.pardir + os.sep) else relative

"""Console helpers shared by commands: the stdout console, progress bars and warnings on stderr."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

from ckptbench.bench.progress import Progress


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


@contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Progress]:
    """A transient rich bar on stderr (drawn only on a terminal); a no-op Progress otherwise."""
    console = stderr_console()
    if not enabled or not console.is_terminal:
        yield Progress()
        return
    from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn
    from rich.progress import Progress as RichBar

    with RichBar(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=console, transient=True,
    ) as bar:
        yield RichProgress(bar)


def print_warnings(warnings: Sequence[dict[str, str]]) -> None:
    """Each warning as one yellow line on stderr, followed by its remedy."""
    for w in warnings:
        click.secho(f"warning: {w['message']}", fg="yellow", err=True)
        click.secho(f"  remedy: {w['remedy']}", fg="yellow", err=True)

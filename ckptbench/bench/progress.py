"""Progress reporting decoupled from the work (as fsspec's Callback): the runner calls these hooks,
``cli/`` subclasses :class:`Progress` to draw bars. The base class does nothing."""

from __future__ import annotations


class Progress:
    def begin(self, total_bytes: int) -> None:
        """The whole run will move ``total_bytes`` (writes plus reads, warm-ups included)."""

    def phase(self, description: str) -> None:
        """A new step started (e.g. ``"2 threads x 4 MiB: write 2/4"``)."""

    def advance(self, step_bytes: int) -> None:
        """``step_bytes`` of the current step are done (absolute within the step, not a delta)."""

    def end_step(self, step_bytes: int) -> None:
        """The current step finished after moving ``step_bytes``."""

"""Outside a terminal (Slurm, CI, a pipe) a measuring command says on stderr when each step starts and ends."""

from __future__ import annotations

import re
from pathlib import Path

from ckptbench import knobs

LINE = re.compile(r"^ckptbench: \d\d:\d\d:\d\d (?P<step>.+?)( \.\.\.|: done, (?P<what>.+))$")


def test_each_step_logs_its_start_and_its_end_with_the_partial_result(cli, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(knobs, "LOG_PROGRESS", 1)
    result = cli("bench", str(tmp_path), "--size", "4MiB", "--files", "2", "--threads", "1", "--block-size", "1MiB",
                 "--repeat", "2", "--warmup", "0", "--json")
    assert result.exit_code == 0, result.stderr
    lines = [m for line in result.stderr.splitlines() if (m := LINE.match(line))]
    started = [m["step"] for m in lines if m["what"] is None]
    ended = {m["step"]: m["what"] for m in lines if m["what"] is not None}
    assert len(started) >= 4 and set(started) == set(ended)  # every write and read of both runs
    assert all(re.match(r"4 MiB in .+ \(\d+\.\d+ GB/s\)$", what) for what in ended.values()), ended
    assert result.stdout.lstrip().startswith("{")  # the JSON on stdout is untouched


def test_the_knob_turns_them_off(cli, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(knobs, "LOG_PROGRESS", 0)
    result = cli("bench", str(tmp_path), "--size", "4MiB", "--files", "2", "--threads", "1", "--block-size", "1MiB",
                 "--repeat", "2", "--warmup", "0", "--json")
    assert result.exit_code == 0 and not any(LINE.match(line) for line in result.stderr.splitlines())

"""CKPTBENCH_* settings (``ckptbench.knobs``): a value that is not a number in its range is refused where it
is read, with one line naming it; from the command line, exit 2 and no traceback before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _run(code_or_args: list[str], **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CKPTBENCH_")}
    return subprocess.run([sys.executable, "-P", *code_or_args], capture_output=True, text=True, timeout=120,
                          env={**clean, "CKPTBENCH_LOG_PROGRESS": "0", **env})


@pytest.mark.parametrize("setting, needle", [
    ("CKPTBENCH_SAVE_THREADS=many", "CKPTBENCH_SAVE_THREADS='many' is not an integer"),
    ("CKPTBENCH_SAVE_THREADS=0", "CKPTBENCH_SAVE_THREADS='0' is out of range: give a value at least 1"),
    ("CKPTBENCH_DRAIN_PART_BYTES=1000", "give 0 or a value from 5242880 to 5368709120"),
    ("CKPTBENCH_SAMPLE_EXTRAPOLATION=nan", "is not a finite number"),
    ("CKPTBENCH_SAMPLE_EXTRAPOLATION=0.5", "give a value at least 1"),
    ("CKPTBENCH_ALIGNMENT_BYTES=3000", "is not a power of two"),
    ("CKPTBENCH_DRAIN_NICE=40", "give a value from 0 to 19"),
    ("CKPTBENCH_STAGE_COW=2", "give a value from 0 to 1"),
])
def test_a_bad_setting_is_one_line_and_exit_2_before_anything_runs(setting: str, needle: str, tmp_path):
    name, value = setting.split("=", 1)
    proc = _run(["-m", "ckptbench", "bench", str(tmp_path), "--size", "4MiB"], **{name: value})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptbench: error: ") and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing measured, nothing written


def test_good_settings_are_taken_and_zero_means_automatic_where_it_may():
    code = ("from ckptbench import knobs; print(knobs.SAVE_THREADS, knobs.DRAIN_PART_BYTES, "
            "knobs.SAMPLE_EXTRAPOLATION, knobs.STAGE_COW)")
    proc = _run(["-c", code], CKPTBENCH_SAVE_THREADS="3", CKPTBENCH_DRAIN_PART_BYTES="0",
                CKPTBENCH_SAMPLE_EXTRAPOLATION="1.5", CKPTBENCH_STAGE_COW="0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["3", "0", "1.5", "0"]
    proc = _run(["-c", code], CKPTBENCH_DRAIN_PART_BYTES=str(8 << 20))
    assert proc.stdout.split()[1] == str(8 << 20)


def test_a_library_caller_gets_a_value_error_it_can_catch_and_the_package_still_imports():
    code = ("import ckptbench\n"
            "try:\n"
            "    ckptbench.save\n"
            "except ValueError as exc:\n"
            "    print(type(exc).__name__, isinstance(exc, ckptbench.UsageError), exc)\n")
    proc = _run(["-c", code], CKPTBENCH_SAVE_BLOCK_BYTES="-1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("SettingError True CKPTBENCH_SAVE_BLOCK_BYTES='-1' is out of range")

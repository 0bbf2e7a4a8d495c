"""pytest-benchmark wrapper around fio_compare: `pytest -m perf tests/perf` (not part of the default run).

Reports the ckptbench/fio ratios in the benchmark's extra_info and on stdout; asserts nothing about
speed (the machine is shared and noisy): the numbers are for people, the goal is >= 0.90x.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

pytestmark = [pytest.mark.perf, pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")]

_spec = importlib.util.spec_from_file_location("fio_compare", Path(__file__).with_name("fio_compare.py"))
fio_compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fio_compare)


def test_ckptbench_vs_fio(benchmark, tmp_path_factory):
    directory = Path("/var/tmp") if Path("/var/tmp").is_dir() else tmp_path_factory.mktemp("perf")
    doc = benchmark.pedantic(
        fio_compare.compare, args=(directory, 2 * 2**30, 2, 4 * 2**20, 3), rounds=1, iterations=1
    )
    benchmark.extra_info.update(doc)
    for op in ("write", "read"):
        print(f"{op}: ckptbench/fio = {doc['ratio_ckptbench_over_fio'][op]:.3f}")
    assert all(v > 0 for tool in doc["samples_gbps"].values() for op in tool.values() for v in op)

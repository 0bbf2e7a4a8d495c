"""One error tree: every error a user may catch is defined in ckptbench/errors.py and exported from ckptbench."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

import ckptbench
from ckptbench import errors

ERRORS = sorted(
    name for name, value in vars(errors).items()
    if inspect.isclass(value) and issubclass(value, Exception) and value.__module__ == errors.__name__
)


def test_every_error_derives_from_the_one_base():
    assert "CorruptCheckpointError" in ERRORS and "CheckpointLockedError" in ERRORS
    for name in ERRORS:
        assert issubclass(getattr(errors, name), errors.CkptbenchError), name


@pytest.mark.parametrize("name", ERRORS)
def test_every_error_is_exported_from_the_package(name: str):
    namespace: dict[str, object] = {}
    exec(f"from ckptbench import {name}", namespace)
    assert namespace[name] is getattr(errors, name)
    assert name in ckptbench.__all__


def test_no_error_class_is_defined_outside_errors_py():
    strays = []
    for info in pkgutil.walk_packages(ckptbench.__path__, prefix="ckptbench."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, errors.CkptbenchError)
                    and value.__module__ != errors.__name__):
                strays.append(f"{value.__module__}.{name}")
    assert not strays, f"define these in ckptbench/errors.py: {sorted(set(strays))}"


def test_the_old_import_locations_still_work():
    from ckptbench.checkpoint.api import CheckpointExistsError, CommitOutcomeUnknown
    from ckptbench.checkpoint.distributed import RankFailedError
    from ckptbench.checkpoint.lock import CheckpointLockedError, LockLostError
    from ckptbench.checkpoint.manifest import CorruptCheckpointError, NotACheckpointError
    from ckptbench.checkpoint.stage import CowStagingError, InsufficientMemoryError

    assert (CheckpointExistsError, CommitOutcomeUnknown, RankFailedError, CheckpointLockedError, LockLostError,
            CorruptCheckpointError, NotACheckpointError, InsufficientMemoryError, CowStagingError) == (
        errors.CheckpointExistsError, errors.CommitOutcomeUnknown, errors.RankFailedError,
        errors.CheckpointLockedError, errors.LockLostError, errors.CorruptCheckpointError,
        errors.NotACheckpointError, errors.InsufficientMemoryError, errors.CowStagingError)


def test_dir_lists_the_public_names_the_lazy_ones_included():
    listed = dir(ckptbench)
    for name in ckptbench.__all__:
        assert name in listed, name
    assert {"save", "load", "Checkpointer"} <= set(listed)
    for name in ckptbench.__all__:
        assert getattr(ckptbench, name) is not None


def test_importing_the_package_and_its_errors_stays_light(tmp_path):
    code = ("import sys\nimport ckptbench\nfrom ckptbench import CorruptCheckpointError, CkptbenchError\n"
            "dir(ckptbench)\nprint('torch' in sys.modules, 'ckptbench.checkpoint' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]

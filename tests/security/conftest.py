"""Fixtures of the trust-boundary tests (see ``security_helpers``): ``attacker`` (another, unprivileged
user; skipped with the reason when the tests do not run as root) and ``arena`` (a shared directory and
the victim's files)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from security_helpers import Arena, Attacker, attacker_ids, make_arena, setpriv_path


@pytest.fixture
def attacker() -> Attacker:
    if os.geteuid() != 0:
        pytest.skip("acting as a second user needs root (setpriv); CI runs as root")
    ids = attacker_ids()
    if ids is None or setpriv_path() is None:
        pytest.skip("no 'nobody' user or no setpriv here")
    return Attacker(*ids)


@pytest.fixture
def arena() -> Iterator[Arena]:
    made = make_arena()
    try:
        yield made
    finally:
        shutil.rmtree(made.root, ignore_errors=True)

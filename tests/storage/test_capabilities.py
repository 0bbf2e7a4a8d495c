"""Optional Store capabilities are declared on the base with defaults; callers ask them, never probe."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ckptbench
from ckptbench.storage.fsspec_store import FsspecStore
from ckptbench.storage.store import LocalStore, Store

PACKAGE_DIR = Path(ckptbench.__file__).parent


def test_a_local_store_is_a_directory_whose_writes_follow_the_copy(tmp_path: Path):
    store = LocalStore(tmp_path / "c")
    assert store.local_path == tmp_path / "c"
    assert store.writes_follow_copy and not store.conditional_writes
    store.prepare()
    store.put_atomic("a", b"1")
    assert store.list_recursive() == store.list() == ["a"]
    assert store.abort_incomplete_uploads() == 0
    assert store.describe() == {}
    with pytest.raises(NotImplementedError):
        store.put_if("b", b"2")


def test_an_fsspec_store_has_no_directory_nor_conditional_writes():
    store = FsspecStore("memory://ckptbench-capabilities/c")
    assert store.local_path is None
    assert not store.writes_follow_copy and not store.conditional_writes
    assert store.server() == store.url
    assert store.abort_incomplete_uploads() == 0


def test_the_base_leaves_every_primitive_to_the_backend():
    store = Store()
    for call in (store.prepare, lambda: store.get("x"), store.list, lambda: store.remove([])):
        with pytest.raises(NotImplementedError):
            call()


def _probes(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        subject = ast.unparse(node.args[0])
        if node.func.id in ("hasattr", "getattr") and "store" in subject.lower():
            found.append(f"{node.func.id}({subject}, ...)")
        if node.func.id == "isinstance" and len(node.args) == 2 and "Store" in ast.unparse(node.args[1]):
            found.append(f"isinstance({subject}, {ast.unparse(node.args[1])})")
    return found


def test_no_store_is_probed_outside_storage():
    problems = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR)
        if rel.parts[0] == "storage":
            continue
        problems += [f"{rel}: {probe}" for probe in _probes(ast.parse(path.read_text()))]
    assert not problems, "ask a capability declared on Store instead:\n" + "\n".join(problems)

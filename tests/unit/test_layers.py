"""The layers of docs/ARCHITECTURE.md, checked on the source: layers import downward only, torch only where
the document allows it. The rules are read from the document, so it cannot drift from what is enforced."""

from __future__ import annotations

import ast
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import ckptbench

PACKAGE_DIR = Path(ckptbench.__file__).parent
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md"


def _names(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def _rules() -> tuple[set[str], dict[str, set[str]], tuple[str, ...]]:
    """(leaves, which parts each part may import, where torch may be imported), as the document states them."""
    text = ARCHITECTURE.read_text()
    leaves = re.search(r"^Leaves \(.*?\): (.*)$", text, re.MULTILINE)
    torch = re.search(r"^torch is imported, lazily \(inside functions\), only in: (.*)$", text, re.MULTILINE)
    assert leaves and torch, "docs/ARCHITECTURE.md lost its 'Leaves (...):' or 'torch is imported ...' line"
    allowed: dict[str, set[str]] = {}
    for row in re.findall(r"^\| `([^`|]+)` \| ([^|]*) \|", text, re.MULTILINE):
        part, imports = row
        allowed[part] = set(_names(imports))
    assert allowed, "docs/ARCHITECTURE.md lost its table of layers"
    return set(_names(leaves.group(1))), allowed, tuple(_names(torch.group(1)))


LEAVES, ALLOWED, TORCH_ALLOWED = _rules()


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def _part(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_layers_import_downward_only():
    problems = []
    for path in _modules():
        part = _part(path)
        allowed = ALLOWED.get(part, set())
        for name in _imports(path):
            if not name.startswith("ckptbench.") or name == "ckptbench.__version__":
                continue
            target = name.split(".")[1]
            if target.startswith("_native"):
                target = "native"
            if target in LEAVES or target == part or "*" in allowed or target == "__version__":
                continue
            if target not in allowed:
                problems.append(f"{path.relative_to(PACKAGE_DIR)} imports {name}")
    assert not problems, "\n".join(problems)


def test_torch_only_where_allowed_and_never_in_model():
    for path in _modules():
        rel = path.relative_to(PACKAGE_DIR).as_posix()
        uses_torch = any(n == "torch" or n.startswith("torch.") for n in _imports(path))
        if uses_torch:
            assert rel.startswith(TORCH_ALLOWED), f"{rel} imports torch"


def test_every_module_imports_in_a_fresh_interpreter(tmp_path):
    names = [m.name for m in pkgutil.walk_packages([str(PACKAGE_DIR)], prefix="ckptbench.")
             if not m.name.endswith("__main__")]
    code = "import importlib, sys\nfor n in sys.argv[1:]: importlib.import_module(n)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)  # not the repo root: the installed package must be the one imported
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "importing ckptbench modules must not import torch"


def test_the_cli_runs_where_nothing_else_imported_importlib_util_first():
    """Every module imports the submodules it uses: site's .pth files (editable installs) import
    importlib.util into most environments, but not a fresh venv's, where `import importlib` alone
    made every lazily loaded command fail with "module 'importlib' has no attribute 'util'"."""
    code = ("import sys\nassert 'importlib.util' not in sys.modules\nfrom ckptbench.cli import main\n"
            "main(['interval', '--ckpt-time', '60s', '--mtbf', '3h', '--json'])\n")
    paths = [str(PACKAGE_DIR.parent)] + [p for p in sys.path if p and "site-packages" in p]
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": ":".join(paths), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"young_interval_s"' in proc.stdout


def test_every_part_of_the_package_is_placed_in_the_document():
    parts = {_part(path) for path in _modules()}
    unplaced = sorted(parts - set(ALLOWED) - LEAVES)
    assert not unplaced, f"add these to the table of layers in docs/ARCHITECTURE.md: {unplaced}"


def test_every_test_the_document_names_exists():
    repo = ARCHITECTURE.parents[1]
    named = set(re.findall(r"`(tests/[^`\s]+\.py)`", ARCHITECTURE.read_text()))
    assert len(named) > 10
    missing = sorted(name for name in named if not (repo / name).is_file())
    assert not missing, f"docs/ARCHITECTURE.md names tests that do not exist: {missing}"


def test_nothing_in_the_repo_points_outside_it():
    repo = ARCHITECTURE.parents[1]
    outside = re.compile(r"\.\./shared|shared/notes|shared/DESIGN|\bDESIGN\.md")
    found = []
    for top in ("README.md", "ckptbench", "csrc", "docs", "tests", "configs", ".ci", "pyproject.toml"):
        for path in [repo / top] if (repo / top).is_file() else sorted((repo / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".png", ".so"):
                text = path.read_text(errors="replace")
                found += [f"{path.relative_to(repo)}: {m.group(0)}" for m in outside.finditer(text)]
    found = [f for f in found if not f.startswith("tests/unit/test_layers.py")]
    assert not found, "point at docs/ instead:\n" + "\n".join(found)

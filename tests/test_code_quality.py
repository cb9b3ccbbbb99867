"""Lint, format and import-layering checks run with the test suite, so CI fails on them."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    # Prefer the tool installed beside this interpreter (the project's venv).
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


@pytest.mark.parametrize(
    "args",
    [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["lint-imports"]],
    ids=["ruff-check", "ruff-format", "import-layers"],
)
def test_tool_passes(args):
    proc = subprocess.run([_tool(args[0]), *args[1:]], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_typed_seams_type_check():
    """mypy passes over the files [tool.mypy] lists (the pool API's structs and client, the wire format,
    the telemetry schema, analytics and the console): a wrong type there fails the suite."""
    proc = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


PACKAGES = ("collector", "analytics", "reports", "tui", "server", "virtualize")


def _import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (at the top or inside functions), read by grimp."""
    grimp = pytest.importorskip("grimp")  # import-linter's graph builder
    graph = grimp.build_graph(*PACKAGES)
    return {
        m: {x for x in graph.find_modules_directly_imported_by(m) if x.split(".")[0] in PACKAGES}
        for m in graph.modules
    }


def test_no_import_circles():
    edges = _import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                group.append(stack.pop())
                if group[-1] == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    assert not circles, f"modules that import each other: {circles}"


def test_nothing_imports_a_cli_module():
    edges = _import_graph()
    wrong = sorted(f"{m} -> {x}" for m, xs in edges.items() for x in xs if x.endswith(".cli") and x != m)
    assert not wrong, wrong


@pytest.mark.parametrize(
    "package, contract_name",
    [
        ("server", "gpuattach and the console reach the pool"),
        ("collector", "Other packages use the collector through its public face"),
    ],
)
def test_a_private_modules_contract_lists_every_private_module_of_its_package(package, contract_name):
    """A new private module of the pool or the collector is covered by its package's contract: the
    list in pyproject.toml names exactly the package's private modules."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["name"].startswith(contract_name)]
    private = {f"{package}.{p.stem}" for p in (ROOT / package).glob("_*.py") if p.stem != "__init__"}
    assert set(contract["forbidden_modules"]) == private


def _temporaries_passed_by_address(source: str) -> list[int]:
    """Lines where a call's result is passed by its address (`np.ones(n).ctypes.data`, `bytes(x).ptr`...):
    nothing holds the object, so its memory may be freed and reused before the callee reads it."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr in ("data", "ptr")
                and isinstance(node.value, ast.Attribute) and node.value.attr == "ctypes"
                and isinstance(node.value.value, ast.Call)):  # fmt: skip
            lines.append(node.lineno)
    return lines


def test_no_gpu_program_passes_the_address_of_a_temporary():
    """A GPU program that copies from `np.ones(n).ctypes.data` reads freed memory: natively it often still
    holds the values, remotely the shim's own allocations reuse it (three programs compared garbage with
    garbage on the H100s before this rule). Every such address must come from a named, held array."""
    found = {}
    for path in sorted((ROOT / "tests" / "gpu").rglob("*.py")) + sorted((ROOT / "tests").glob("remote_*.py")):
        if lines := _temporaries_passed_by_address(path.read_text()):
            found[str(path.relative_to(ROOT))] = lines
    assert not found, f"hold these arrays in a name before passing their address: {found}"
    assert _temporaries_passed_by_address("f(np.ones(4).ctypes.data)") == [1]  # the rule sees the pattern

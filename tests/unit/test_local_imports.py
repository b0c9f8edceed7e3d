"""slonk.local's modules import each other one way: no cycle, so each can be read, tested
and loaded without the ones above it (the fake API server without the lifecycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import slonk.local

PACKAGE = Path(slonk.local.__file__).parent


def _imports() -> dict[str, set[str]]:
    """{module: the slonk.local modules it imports, at the top or inside a function}."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "slonk.local":
                names |= {f"slonk.local.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
        found[path.stem] = {n.split(".")[2] for n in names if n.startswith("slonk.local.")}
    return found


def _cycle(imports: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for imported in sorted(imports.get(module, ())):
            if found := visit(imported, [*path, module]):
                return found
        done.add(module)
        return None

    return next((c for m in sorted(imports) if (c := visit(m, []))), None)


def test_local_modules_import_each_other_one_way():
    assert _cycle(_imports()) is None


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_lifecycle_and_the_fake_api_server_do_not_import_each_other():
    imports = _imports()
    assert "cluster" not in imports["fake_apiserver"]
    assert "kubelet" in imports["fake_apiserver"]  # it restarts pods through kubelet

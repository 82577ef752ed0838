"""How many layers deep each top-level package is in its own import graph (issue 51).

    python bench/one_core/layers.py [PACKAGE ...] [--max N] [--module-level] [--path] [--nested]

A package's graph: one node per module of the package (its ``__init__`` included), one edge
per import of another module of the same package. Every import statement counts, as
import-linter (grimp) counts them: module level, under ``if TYPE_CHECKING:`` and inside
functions (a lazy import is still a dependency); ``--module-level`` counts only the imports
run when the module loads (module level, ``if TYPE_CHECKING:`` blocks excluded), the graph
Python walks at import time. ``from a.b import c`` is an edge to ``a.b.c`` when that is a
module, else to ``a.b``. The depth is the number of modules on the longest import path (a
module that imports nothing of its package is layer 1); a cycle is reported and counted as
one node. Exit status 1 when a package is deeper than ``--max`` (default 6).

``--nested`` reads each package as import-linter's layers contracts read a container: the
package and every subpackage in it, each over its own direct children (a child subpackage is
one node holding all its modules; the package's ``__init__`` is a node of its own), so a
subpackage's internal depth is counted in its own graph, not its parent's.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("router", "policies", "traces")


def modules(package: str, root: Path = ROOT) -> dict[str, Path]:
    """Every module of ``package``: dotted name -> file."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module, module_level: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    if not module_level:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node
        return
    stack: list[ast.stmt] = list(tree.body)
    while stack:  # statements run at load: module level, if/try bodies, not TYPE_CHECKING
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                stack.extend(node.body)
            stack.extend(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                stack.extend(block)
            for handler in node.handlers:
                stack.extend(handler.body)


def graph(package: str, module_level: bool = False, root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports."""
    mods = modules(package, root)
    edges: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _imports(tree, module_level):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = name.split(".")
                    parts = parts if is_pkg else parts[:-1]
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in mods else base)
            for target in targets:
                while target and target not in mods:  # import a.b.c of a non-module: a.b
                    target = target.rpartition(".")[0]
                if target and target != name and target.split(".")[0] == package:
                    edges[name].add(target)
    return edges


def nested(edges: dict[str, set[str]]) -> dict[str, dict[str, set[str]]]:
    """Every package in ``edges`` (the top-level one and each subpackage) -> the graph over
    its direct children: an edge where a module under one child imports one under another."""
    packages = {name.rpartition(".")[0] for name in edges if "." in name}
    packages |= {name for name in edges if any(m.startswith(name + ".") for m in edges)}
    graphs: dict[str, dict[str, set[str]]] = {}
    for package in sorted(packages):
        prefix = package + "."

        def child(name: str, package: str = package, prefix: str = prefix) -> str | None:
            if name == package:
                return package  # its __init__
            if not name.startswith(prefix):
                return None
            return prefix + name[len(prefix) :].split(".")[0]

        graph: dict[str, set[str]] = {}
        for name, targets in edges.items():
            source = child(name)
            if source is None:
                continue
            graph.setdefault(source, set())
            for target in targets:
                dest = child(target)
                if dest is not None and dest != source:
                    graph[source].add(dest)
                    graph.setdefault(dest, set())
        graphs[package] = graph
    return graphs


def depth(edges: dict[str, set[str]]) -> tuple[int, list[str], list[list[str]]]:
    """(layers on the longest path, that path top first, the cycles found)."""
    memo: dict[str, tuple[int, list[str]]] = {}
    on_stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(name: str) -> tuple[int, list[str]]:
        if name in memo:
            return memo[name]
        if name in on_stack:
            cycles.append([*on_stack[on_stack.index(name) :], name])
            return 0, []
        on_stack.append(name)
        best: tuple[int, list[str]] = (0, [])
        for target in sorted(edges[name]):
            got = visit(target)
            if got[0] > best[0]:
                best = got
        on_stack.pop()
        memo[name] = (best[0] + 1, [name, *best[1]])
        return memo[name]

    top = max((visit(name) for name in sorted(edges)), default=(0, []))
    return top[0], top[1], cycles


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", default=list(PACKAGES))
    parser.add_argument("--max", type=int, default=6, help="most layers allowed")
    parser.add_argument("--module-level", action="store_true", help="only imports run at load")
    parser.add_argument("--path", action="store_true", help="print each longest path")
    parser.add_argument(
        "--nested", action="store_true", help="each package and subpackage over its children"
    )
    args = parser.parse_args(argv)
    worst = 0
    for package in args.packages:
        edges = graph(package, args.module_level)
        graphs = nested(edges) if args.nested else {package: edges}
        for name, sub in graphs.items():
            layers, path, cycles = depth(sub)
            worst = max(worst, layers)
            print(f"{name}: {layers} layers ({len(sub)} {'nodes' if args.nested else 'modules'})")
            if args.path:
                print("   " + " -> ".join(path))
            for cycle in cycles:
                print("   cycle: " + " -> ".join(cycle))
    return 1 if worst > args.max else 0


if __name__ == "__main__":
    sys.exit(main())

"""How deep each top-level package's own import graph is (issue 51): bench/one_core/layers.py
counts every import of a module of the same package (module level, ``if TYPE_CHECKING:`` and
function level, as import-linter does) and the modules on the longest path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LAYERS = 6


def _layers():
    spec = importlib.util.spec_from_file_location("layers", ROOT / "bench/one_core/layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("package", ["traces", "policies"])
def test_package_at_most_six_layers_deep(package: str) -> None:
    layers = _layers()
    depth, path, cycles = layers.depth(layers.graph(package))
    assert not cycles
    assert depth <= MAX_LAYERS, " -> ".join(path)


def test_layers_counts_the_longest_import_path(tmp_path: Path) -> None:
    layers = _layers()
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "sub" / "c.py").write_text("import os\n")
    (pkg / "d.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    import pkg.a\n")
    assert layers.depth(layers.graph("pkg", root=tmp_path))[:2] == (
        4,
        ["pkg.d", "pkg.a", "pkg.sub.b", "pkg.sub.c"],
    )
    # at load only: b's import of c runs in a function, d's under TYPE_CHECKING
    assert layers.depth(layers.graph("pkg", module_level=True, root=tmp_path))[0] == 2

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


def _package(root: Path, files: dict[str, str]) -> None:
    """A package ``pkg`` under ``root`` holding ``files`` (paths inside it: source)."""
    for name, source in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)


@pytest.mark.parametrize("package", ["traces", "policies"])
def test_package_at_most_six_layers_deep(package: str) -> None:
    layers = _layers()
    depth, path, cycles = layers.depth(layers.graph(package))
    assert not cycles
    assert depth <= MAX_LAYERS, " -> ".join(path)


@pytest.mark.parametrize("package", ["router", "traces", "policies"])
def test_every_package_at_most_six_layers_deep_over_its_children(package: str) -> None:
    """Read as import-linter reads a container: each package and subpackage over its own
    direct children (router/ flat over its 77 modules is deeper: its subpackages stack)."""
    layers = _layers()
    for name, graph in layers.nested(layers.graph(package)).items():
        depth, path, cycles = layers.depth(graph)
        assert not cycles, name
        assert depth <= MAX_LAYERS, f"{name}: " + " -> ".join(path)


def test_nested_squashes_each_subpackage_into_one_node(tmp_path: Path) -> None:
    layers = _layers()
    _package(
        tmp_path,
        {
            "__init__.py": "",
            "sub/__init__.py": "from pkg.sub import b\n",
            "a.py": "from pkg.sub import b\n",
            "sub/b.py": "from pkg.sub import c\n",
            "sub/c.py": "from pkg import d\n",
            "d.py": "",
        },
    )
    graphs = layers.nested(layers.graph("pkg", root=tmp_path))
    assert graphs["pkg"] == {
        "pkg.a": {"pkg.sub"},
        "pkg.sub": {"pkg.d"},
        "pkg.d": set(),
        "pkg": set(),
    }
    assert graphs["pkg.sub"] == {
        "pkg.sub": {"pkg.sub.b"},
        "pkg.sub.b": {"pkg.sub.c"},
        "pkg.sub.c": set(),
    }
    assert layers.depth(graphs["pkg"])[0] == 3
    assert layers.depth(layers.graph("pkg", root=tmp_path))[0] == 4  # flat: a -> b -> c -> d


def test_layers_counts_the_longest_import_path(tmp_path: Path) -> None:
    layers = _layers()
    _package(
        tmp_path,
        {
            "__init__.py": "",
            "sub/__init__.py": "",
            "a.py": "from pkg.sub import b\n",
            "sub/b.py": "def f():\n    from . import c\n",
            "sub/c.py": "import os\n",
            "d.py": "import typing\nif typing.TYPE_CHECKING:\n    import pkg.a\n",
        },
    )
    assert layers.depth(layers.graph("pkg", root=tmp_path))[:2] == (
        4,
        ["pkg.d", "pkg.a", "pkg.sub.b", "pkg.sub.c"],
    )
    # at load only: b's import of c runs in a function, d's under TYPE_CHECKING
    assert layers.depth(layers.graph("pkg", module_level=True, root=tmp_path))[0] == 2

"""deploy/check_lock.py: the lock's lines for this environment against what is installed, and
the locks themselves (pinned, consistent with each other and with pyproject.toml's bounds)."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).parents[2]
_spec = importlib.util.spec_from_file_location("check_lock", ROOT / "deploy" / "check_lock.py")
check_lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_lock)

LOCK = """\
annotated-types==0.8.0    # via pydantic
colorama==0.4.6 ; sys_platform == 'win32'  # via tqdm
Contour_Py==1.3.3 ; python_full_version < '3.12'  # via matplotlib
contour-py==1.4.0 ; python_full_version >= '3.12'  # via matplotlib
"""


def test_only_the_lines_whose_marker_holds_are_wanted() -> None:
    wanted = check_lock.locked(LOCK)
    assert wanted["annotated-types"] == "0.8.0"
    assert ("colorama" in wanted) == (sys.platform == "win32")
    assert wanted["contour-py"] == ("1.3.3" if sys.version_info < (3, 12) else "1.4.0")


def test_an_unpinned_line_is_refused() -> None:
    with pytest.raises(ValueError, match="not pinned"):
        check_lock.locked("fastapi>=0.110\n")


def test_every_difference_is_named() -> None:
    wanted = {"a": "1.0", "b": "2.0", "c": "3.0"}
    have = {"a": "1.0", "b": "2.1", "d": "4.0", "pip": "25.0"}
    assert check_lock.differences(wanted, have) == [
        "b: 2.1 installed, 2.0 locked",
        "missing: c==3.0",
        "not in the lock: d==4.0",
    ]
    assert check_lock.differences(wanted | {"d": "4.0"}, have | {"c": "3.0", "b": "2.0"}) == []


def _pins(path: Path) -> dict[tuple[str, str], str]:
    """(name, marker) -> version of a lock file."""
    pins = {}
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line:
            requirement, _, marker = line.partition(";")
            name, _, version = requirement.partition("==")
            pins[check_lock.canonical(name.strip()), marker.strip()] = version.strip()
    return pins


def test_the_locks_pin_the_same_runtime_versions_within_pyprojects_bounds() -> None:
    runtime = _pins(ROOT / "requirements" / "runtime.lock")
    test = _pins(ROOT / "requirements" / "test.lock")
    assert runtime and all(runtime.values())
    for key, version in runtime.items():
        assert test.get(key) == version, f"{key}: runtime.lock {version}, test.lock {test.get(key)}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"] + project["optional-dependencies"]["test"]:
        req = Requirement(line)
        versions = [v for (name, _), v in test.items() if name == check_lock.canonical(req.name)]
        assert versions, f"{req.name} is not in requirements/test.lock: run make lock"
        for version in versions:
            assert req.specifier.contains(version, prereleases=True), f"{req.name}=={version}"

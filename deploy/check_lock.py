"""Fail unless this Python environment holds exactly the locked set (``pip freeze`` == lock).

    python deploy/check_lock.py requirements/test.lock

The lock (``make lock``: ``uv pip compile --universal``) lists ``name==version`` lines, some
with an environment marker (``; sys_platform == 'win32'``); the lines whose marker holds here
are what must be installed, each at its version, and nothing else may be (the project
itself, and pip / setuptools / wheel as ``pip freeze`` leaves them out, excepted). Prints
every difference; exit status 1 if there is any. Run by ``make`` after installing the venv and
by deploy/install.sh (the image).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

try:
    from packaging.markers import Marker
except ImportError:  # the image's venv: pip (still there while it installs) vendors it
    from pip._vendor.packaging.markers import Marker

PROJECT = "cache-router"
UNLISTED = {"pip", "setuptools", "wheel", "distribute"}  # what `pip freeze` leaves out


def canonical(name: str) -> str:
    """PEP 503 name: lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(text: str) -> dict[str, str]:
    """``{name: version}`` of the lock's lines whose marker holds in this environment."""
    wanted: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        requirement, _, marker = line.partition(";")
        name, sep, version = requirement.strip().partition("==")
        if not sep:
            raise ValueError(f"not pinned with ==: {raw!r}")
        if marker.strip() and not Marker(marker.strip()).evaluate():
            continue
        wanted[canonical(name)] = version.strip()
    return wanted


def installed() -> dict[str, str]:
    """``{name: version}`` of every distribution on ``sys.path``, but the project's own."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = canonical(dist.metadata["Name"] or "")
        if name and name != PROJECT:
            found.setdefault(name, dist.version)  # the first on sys.path is what imports
    return found


def differences(wanted: dict[str, str], have: dict[str, str]) -> list[str]:
    """What differs, one line each (empty: the environment is the lock)."""
    out = []
    for name in sorted(wanted.keys() | have.keys()):
        want, got = wanted.get(name), have.get(name)
        if want == got or (want is None and name in UNLISTED):
            continue
        if got is None:
            out.append(f"missing: {name}=={want}")
        elif want is None:
            out.append(f"not in the lock: {name}=={got}")
        else:
            out.append(f"{name}: {got} installed, {want} locked")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    lock = Path(argv[0])
    diff = differences(locked(lock.read_text()), installed())
    for line in diff:
        print(f"check_lock: {line}", file=sys.stderr)
    if diff:
        print(f"check_lock: this environment is not {lock} (make venv)", file=sys.stderr)
        return 1
    print(f"check_lock: the environment is exactly {lock}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

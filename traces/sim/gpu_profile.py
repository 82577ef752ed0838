"""GPU cost profiles for the worker model (``--gpu-profile``), and which one it uses by default.

The profiles themselves (the terms, the shipped files, the reader) live in
:mod:`router.cache.cost_profile`, below both the worker model and the router, which prices
its TTFT prediction with the same files (``serve --cost-profile``); this module keeps their
names where the trace tools have always found them.
"""

from __future__ import annotations

import functools

from router.cache.cost_profile import (
    DEFAULT,
    FLAT,
    GpuProfile,
    from_dict,
    load,
    profile_names,
    profiles_dir,
    resolve,
)

DEFAULT_PROFILE = DEFAULT
"""What ``--gpu-profile`` and ``WorkerModelConfig()`` price steps by when not told (``flat``
for the flat model)."""


@functools.cache
def default_profile() -> GpuProfile | None:
    """:data:`DEFAULT_PROFILE`, loaded once."""
    return resolve(DEFAULT_PROFILE)


__all__ = [
    "DEFAULT_PROFILE",
    "FLAT",
    "GpuProfile",
    "default_profile",
    "from_dict",
    "load",
    "profile_names",
    "profiles_dir",
    "resolve",
]

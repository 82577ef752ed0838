"""capped: LMetric on a session-mass-capped trace (seed 002 §5).

Not a new picker: the trace tools keep only the first ``MAX_TURNS`` turns of each session
(ordered by turn id, then timestamp) and the router runs plain LMetric on what is left.
Comparing ``capped`` with ``lmetric`` asks how much of LMetric's residual hot-spotting is
driven by heavy-tail sessions. The name exists so runs and metrics are labelled apart.
"""

from __future__ import annotations

from policies.lmetric import LMetricPicker

MAX_TURNS = 8
"""The seed's per-session turn cap; applied by the trace tools, never by the picker."""


class CappedPicker(LMetricPicker):
    """:class:`LMetricPicker` under the ``capped`` label (same parameters, same picks)."""

    name = "capped"

"""Bounded session → worker bindings for the affinity pickers (sticky, unified).

An LRU ``OrderedDict`` with a maximum number of sessions: the least recently routed session
is forgotten first, so memory stays bounded however many session ids a trace or a client
invents. A forgotten session is simply routed as a new one.
"""

from __future__ import annotations

from collections import OrderedDict

DEFAULT_MAX_SESSIONS = 100_000


class SessionTable:
    """LRU map of session id → worker index with a capacity in sessions."""

    __slots__ = ("_bindings", "max_sessions")

    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        if max_sessions <= 0:
            raise ValueError("max_sessions must be positive")
        self.max_sessions = max_sessions
        self._bindings: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._bindings)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._bindings

    def get(self, session_id: str) -> int | None:
        """The bound worker index, marking the session recently used; None if unbound."""
        worker = self._bindings.get(session_id)
        if worker is not None:
            self._bindings.move_to_end(session_id)
        return worker

    def peek(self, session_id: str) -> int | None:
        """The bound worker index without marking the session used; None if unbound."""
        return self._bindings.get(session_id)

    def bind(self, session_id: str, worker: int) -> None:
        """Bind (or rebind) a session, evicting the least recently used beyond capacity."""
        bindings = self._bindings
        bindings[session_id] = worker
        bindings.move_to_end(session_id)
        if len(bindings) > self.max_sessions:
            bindings.popitem(last=False)

    def forget(self, session_id: str) -> None:
        """Drop a binding if present."""
        self._bindings.pop(session_id, None)

"""Routing pickers: pure functions of (request features, worker views, the picker's own state)."""

"""Trace formats, trace tools, the simulated worker and the offline simulator."""

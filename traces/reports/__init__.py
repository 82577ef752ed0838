"""What the commands write: results.json / .md and plots, the hit gap's table, the capacity
report, the per-request JSON lines."""

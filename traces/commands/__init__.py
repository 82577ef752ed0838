"""The trace commands (`trace`, `simulate`, `replay`, `sweep`, `capacity`, `demo`), what they
run (run_*.py) and their one options module; no command imports another."""

"""Trace data and formats: the requests (record.py), their readers (formats/), the `trace`
tools' halves, prompts and pacing rebuilt from them, and a run's outcomes (run.py)."""

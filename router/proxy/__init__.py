"""The HTTP proxy: the ASGI app and its server, the hot path (parse, tokenize, pick, forward,
scan usage), errors and access rules, the admin API, the dashboard, metrics, ``serve``."""

"""What every front end runs in: the router's runtime (pool, background tasks, the core) and
its HTTP side (admin API, dashboard, ``/metrics``), the uvicorn server with the client
limits, the command's options and ``--processes``."""

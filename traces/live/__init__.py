"""Live runs: a streaming replay through a router, and the sim workers and routers a sweep
starts as processes."""

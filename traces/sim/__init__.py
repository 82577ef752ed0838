"""The offline simulator and its worker model: the router's core in virtual time over worker
models, its configuration, the bounds no router beats, the hit gap, the capacity search."""

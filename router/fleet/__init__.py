"""The workers behind the router: the pool and its picker, connections to each worker, health
and circuits, and the background feeds that read each worker's truth (/metrics, KV events)."""

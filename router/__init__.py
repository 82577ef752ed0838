"""cache-router: the proxy service and the shadow cache models it keeps per worker."""

__version__ = "0.1.0"

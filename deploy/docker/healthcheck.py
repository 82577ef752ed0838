"""The image's HEALTHCHECK: is the router process serving HTTP?

    python healthcheck.py            # exit 0 if GET /health answers 200 or 503, else 1
    python healthcheck.py --ready    # exit 0 only on 200 (at least one healthy worker)

The router answers /health with 503 while none of its workers is healthy (GPU workers can
take minutes to load a model); that is a live router, so the default (liveness) accepts it.
The port is $CACHE_ROUTER_PORT, else `port` in the config file ($CACHE_ROUTER_HEALTHCHECK_CONFIG,
default /etc/cache-router/config.yaml), else 8080, as `cache-router serve` resolves it.
Standard library plus PyYAML (a dependency of the router) only, so it starts fast.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

CONFIG_FILE = "/etc/cache-router/config.yaml"
DEFAULT_PORT = 8080


def router_port() -> int:
    if os.environ.get("CACHE_ROUTER_PORT"):
        return int(os.environ["CACHE_ROUTER_PORT"])
    path = os.environ.get("CACHE_ROUTER_HEALTHCHECK_CONFIG", CONFIG_FILE)
    try:
        import yaml

        with open(path) as f:
            data = yaml.safe_load(f) or {}
        return int(data.get("port", DEFAULT_PORT))
    except (OSError, ValueError, AttributeError, ImportError):
        return DEFAULT_PORT


def main(argv: list[str]) -> int:
    ready = "--ready" in argv
    url = f"http://127.0.0.1:{router_port()}/health"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        print(f"healthcheck: {url}: {exc}", file=sys.stderr)
        return 1
    ok = status == 200 or (status == 503 and not ready)
    print(f"healthcheck: {url}: HTTP {status}", file=sys.stderr if not ok else sys.stdout)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

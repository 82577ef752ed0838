"""``cache-router epp``: the router core behind Envoy's external processing (GIE's
endpoint picker protocol)."""

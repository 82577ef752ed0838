"""The router core every front end shares: a request read (parse, tokens, features), picked,
booked, learned from and released (:mod:`router.core.routing`), the error vocabulary, the
metrics and the client keys. No front end's transport: ``serve``'s HTTP proxy and the
endpoint picker's ext_proc both sit above it."""

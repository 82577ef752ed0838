"""``create_app(settings)``: the proxy as one ASGI application.

The router (:class:`~router.service.app.RouterApp`: runtime, core, admin API, lifespan) and
:class:`~router.proxy.forward.Forwarder` over its core: the routed endpoints go straight to it
(the hot path: no framework routing or request objects): generation (chat, completions,
/generate, responses), the calls on a stored response and the engines' other endpoints
(:data:`~router.core.parse.OTHER_PATHS`); every other path goes to the admin app.
"""

from __future__ import annotations

from router.config import Settings
from router.core.parse import routed_kind
from router.proxy.forward import Forwarder
from router.service.app import RouterApp


class ProxyApp(RouterApp):
    """The router with a forwarder over its core, serving the routed endpoints."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.forwarder = Forwarder(self.core)

    async def routed(self, scope, receive, send) -> bool:
        endpoint = routed_kind(scope["method"], scope["path"])
        if endpoint is None:
            return False
        if not await self._unavailable_while_draining(send):
            await self.forwarder(scope, receive, send, endpoint)
        return True


def create_app(settings: Settings) -> ProxyApp:
    """A fresh proxy application for ``settings``."""
    return ProxyApp(settings)

"""API key -> handler. ApiVersions is derived from this table, so the broker
never advertises an API it cannot serve.

Each handler module registers its functions with `@handler(api_key, lo, hi)`.
A handler is `async def fn(ctx: RequestContext, body) -> response | None`
(None means no response is sent, e.g. Produce with acks=0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from ..protocol.messages import response_class, spec_max_version
from .auth.acl import Operation, ResourceType
from .auth_check import authorize
from .config import Listener
from .services import Services
from .session import Connection

Handler = Callable[["RequestContext", Any], Awaitable[Any]]


@dataclass(slots=True, frozen=True)
class Route:
    api_key: int
    min_version: int
    max_version: int
    fn: Handler


ROUTES: dict[int, Route] = {}
# supported_versions() made once (every request reads it); a registration drops it.
_SUPPORTED: dict[int, tuple[int, int]] | None = None


def handler(api_key: int, min_version: int, max_version: int) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        if api_key in ROUTES:
            raise RuntimeError(f"api key {api_key} registered twice")
        hi = min(max_version, spec_max_version(api_key))
        ROUTES[api_key] = Route(api_key, min_version, hi, fn)
        global _SUPPORTED
        _SUPPORTED = None
        return fn
    return register


def supported_versions() -> dict[int, tuple[int, int]]:
    """api key -> (min, max) version served. One shared dict: read it, never change it
    (the connection looks it up for every request; building it each time cost ~1%)."""
    global _SUPPORTED
    if _SUPPORTED is None:
        _SUPPORTED = {k: (r.min_version, r.max_version) for k, r in ROUTES.items()}
    return _SUPPORTED


@dataclass(slots=True)
class RequestContext:
    services: Services   # what handlers use, by name (semel.broker.services)
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    peer: str
    # The semel.broker.session.Connection the request came on: per-connection state
    # (principal / session for the security layer).
    connection: Connection

    @property
    def listener(self) -> Listener | None:
        """The listener this request came on; None on the default PLAINTEXT one."""
        return self.connection.listener

    def response(self, **fields: Any) -> Any:
        """The response object of this request's API at this version."""
        cls = response_class(self.api_key)
        return cls(version=self.api_version, **fields)

    def cls(self) -> Any:
        return response_class(self.api_key)

    def authorize(self, operation: Operation | str, resource_type: ResourceType | str, name: str) -> bool:
        """May this connection's principal do `operation` on the resource? Names or
        enums of semel.broker.auth.acl ("WRITE", "TOPIC", "payments"). A denial is
        counted (semel_authorization_denials_total) and logged; the caller answers
        with the matching *_AUTHORIZATION_FAILED code and writes nothing. Always
        True on a broker without security."""
        return authorize(self, operation, resource_type, name)

"""The one authorization call handlers and the router use (RequestContext.authorize)."""
from __future__ import annotations

import logging

from .acl import ANONYMOUS, Operation, ResourceType

log = logging.getLogger("semel.broker.auth")


def principal_of(ctx) -> tuple[str, str]:
    conn = ctx.connection
    if conn is None:
        return ANONYMOUS, "?"
    return conn.principal or ANONYMOUS, conn.ip


def authorize(ctx, operation, resource_type, name: str) -> bool:
    authorizer = getattr(ctx.broker, "authorizer", None)
    if authorizer is None or not authorizer.enabled:
        return True
    op = operation if isinstance(operation, Operation) else Operation[str(operation).upper()]
    rtype = resource_type if isinstance(resource_type, ResourceType) else ResourceType[str(resource_type).upper()]
    principal, host = principal_of(ctx)
    name = name or ""   # (a topic named only by id, a null name: matches wildcard/empty-prefix ACLs only)
    if authorizer.authorize(principal, host, op, rtype, name):
        return True
    _denied(ctx, principal, op, rtype, name)
    return False


def authorize_any(ctx, operation: Operation, resource_type: ResourceType) -> bool:
    authorizer = getattr(ctx.broker, "authorizer", None)
    if authorizer is None or not authorizer.enabled:
        return True
    principal, host = principal_of(ctx)
    return authorizer.authorize_any(principal, host, operation, resource_type)


def _denied(ctx, principal: str, op: Operation, rtype: ResourceType, name: str) -> None:
    ctx.broker.metrics.authorization_denials.labels(op.name, rtype.name).inc()
    log.info("denied %s %s on %s %r (api %d from %s)", principal, op.name, rtype.name, name, ctx.api_key, ctx.peer)

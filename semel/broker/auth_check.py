"""The one authorization call handlers and the router use (RequestContext.authorize)."""
from __future__ import annotations

import logging
from typing import Protocol

from .auth.acl import ANONYMOUS, CLUSTER_NAME, VALID_OPERATIONS, Operation, ResourceType
from .services import Services
from .session import Connection

log = logging.getLogger("semel.broker.auth")


class Requester(Protocol):
    """What these checks read of a request (semel.broker.router.RequestContext, which
    calls them)."""
    services: Services
    connection: Connection
    api_key: int
    peer: str


def principal_of(ctx: Requester) -> tuple[str, str]:
    conn = ctx.connection
    if conn.principal is None:
        conn.principal = certificate_principal(conn)
    return conn.principal or ANONYMOUS, conn.ip


# Attribute names as RFC 2253 (and Kafka's default SSL principal builder) writes them.
_RDN_NAMES = {"commonName": "CN", "organizationalUnitName": "OU", "organizationName": "O", "localityName": "L",
              "stateOrProvinceName": "ST", "countryName": "C", "streetAddress": "STREET", "domainComponent": "DC",
              "userId": "UID"}


def certificate_principal(conn: Connection) -> str | None:
    """On an SSL listener (TLS without SASL), the client certificate's subject as
    Kafka names it: "User:CN=alice,OU=payments,O=Example" (RFC 2253: last RDN first).
    None without a verified certificate (ANONYMOUS) and on SASL listeners, where
    the SASL login is the principal."""
    listener = conn.listener
    if listener is None or not listener.tls or listener.sasl:
        return None
    cert = conn.transport.get_extra_info("peercert") if conn.transport is not None else None
    if not cert or not cert.get("subject"):
        return None
    return "User:" + ",".join("+".join(f"{_RDN_NAMES.get(k, k)}={_rfc2253_escape(v)}" for k, v in rdn)
                              for rdn in reversed(cert["subject"]))


def _rfc2253_escape(value: str) -> str:
    chars = ["\\" + ch if ch in ',+"\\<>;=' else ch for ch in value]
    if chars and chars[0] in ("#", " "):    # a leading '#' or space, and a trailing space
        chars[0] = "\\" + chars[0]
    if len(chars) > 1 and chars[-1] == " ":
        chars[-1] = "\\ "
    return "".join(chars)


def authorize(ctx: Requester, operation: Operation | str, resource_type: ResourceType | str, name: str) -> bool:
    authorizer = ctx.services.authorizer
    if not authorizer.enabled:
        return True
    op = operation if isinstance(operation, Operation) else Operation[str(operation).upper()]
    rtype = resource_type if isinstance(resource_type, ResourceType) else ResourceType[str(resource_type).upper()]
    principal, host = principal_of(ctx)
    name = name or ""   # (a topic named only by id, a null name: matches wildcard/empty-prefix ACLs only)
    if authorizer.authorize(principal, host, op, rtype, name):
        return True
    _denied(ctx, principal, op, rtype, name)
    return False


def authorize_any(ctx: Requester, operation: Operation, resource_type: ResourceType) -> bool:
    authorizer = ctx.services.authorizer
    if not authorizer.enabled:
        return True
    principal, host = principal_of(ctx)
    return authorizer.authorize_any(principal, host, operation, resource_type)


def authorized_operations(ctx: Requester, asked: bool, resource_type: ResourceType, name: str = CLUSTER_NAME) -> set[int] | None:
    """KIP-430: the operation codes the requester may perform on the resource, for
    the authorized_operations fields of Metadata, DescribeCluster and DescribeGroups.
    None when the request did not ask (the codec writes Kafka's -2^31 for it). Without
    an authorizer, every operation the resource type supports, as Kafka answers.
    Asks the authorizer directly: a missing operation is an answer, not a denial to count."""
    if not asked:
        return None
    supported = VALID_OPERATIONS[resource_type] - {Operation.ALL}
    authorizer = ctx.services.authorizer
    if not authorizer.enabled:
        return {int(op) for op in supported}
    principal, host = principal_of(ctx)
    return {int(op) for op in supported if authorizer.authorize(principal, host, op, resource_type, name or "")}


def _denied(ctx: Requester, principal: str, op: Operation, rtype: ResourceType, name: str) -> None:
    ctx.services.metrics.authorization_denials.labels(op.name, rtype.name).inc()
    log.info("denied %s %s on %s %r (api %d from %s)", principal, op.name, rtype.name, name, ctx.api_key, ctx.peer)

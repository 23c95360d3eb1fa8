"""SaslHandshake (17) and SaslAuthenticate (36): Kafka's SASL framing on top of
auth.sasl.SaslSession. Failures answer with Kafka's code and close the connection
(Connection.closing), and are logged and counted (semel_failed_logins_total)."""
from __future__ import annotations

import logging

from ...protocol.errors import KafkaError
from ..auth.sasl import AuthFailed, IllegalState, SaslSession
from ..connection import bad_input_log
from ..router import handler

log = logging.getLogger("semel.broker.auth")


def _session(ctx) -> SaslSession | None:
    conn = ctx.connection
    listener = getattr(conn, "listener", None)
    if conn is None or listener is None or not listener.sasl:
        return None
    if conn.session is None:
        conn.session = SaslSession(ctx.broker.users, tuple(ctx.broker.config.sasl_enabled_mechanisms))
    return conn.session


@handler(17, 1, 1)
async def sasl_handshake(ctx, body):
    enabled = list(ctx.broker.config.sasl_enabled_mechanisms)
    session = _session(ctx)
    if session is None:
        return ctx.response(error_code=KafkaError.ILLEGAL_SASL_STATE, mechanisms=[])
    try:
        session.handshake(body.mechanism)
    except IllegalState:
        ctx.connection.closing = True
        return ctx.response(error_code=KafkaError.ILLEGAL_SASL_STATE, mechanisms=enabled)
    except LookupError:
        _failed(ctx, str(body.mechanism)[:40], f"unsupported mechanism {str(body.mechanism)[:40]!r}")
        ctx.connection.closing = True
        return ctx.response(error_code=KafkaError.UNSUPPORTED_SASL_MECHANISM, mechanisms=enabled)
    return ctx.response(error_code=KafkaError.NONE, mechanisms=enabled)


@handler(36, 0, 2)
async def sasl_authenticate(ctx, body):
    session = _session(ctx)
    if session is None:
        ctx.connection.closing = True
        return _auth_response(ctx, KafkaError.ILLEGAL_SASL_STATE, "not a SASL listener")
    try:
        out = session.authenticate(bytes(body.auth_bytes or b""))
    except IllegalState as exc:
        ctx.connection.closing = True
        return _auth_response(ctx, KafkaError.ILLEGAL_SASL_STATE, str(exc))
    except AuthFailed as exc:
        _failed(ctx, session.mechanism, f"user {session.user!r}: {exc.__cause__ or exc}")
        ctx.connection.closing = True
        return _auth_response(ctx, KafkaError.SASL_AUTHENTICATION_FAILED, str(exc))
    if session.principal is not None:
        ctx.connection.principal = session.principal
        log.info("%s authenticated as %s (%s)", ctx.peer, session.principal, session.mechanism)
    return _auth_response(ctx, KafkaError.NONE, None, out)


def _auth_response(ctx, code: KafkaError, message: str | None, token: bytes = b""):
    return ctx.response(error_code=code, error_message=message, auth_bytes=token, session_lifetime_ms=0)


def _failed(ctx, mechanism: str, why: str) -> None:
    ctx.broker.metrics.failed_logins.labels(mechanism or "?").inc()
    bad_input_log.warning("failed login from %s (%s): %s", ctx.peer, mechanism, why)

"""SaslHandshake (17) and SaslAuthenticate (36): Kafka's SASL framing on top of
auth.sasl.SaslSession. Failures answer with Kafka's code and close the connection
(Connection.closing), and are logged and counted (semel_failed_logins_total).

A SaslHandshake on an authenticated connection starts a re-authentication
(KIP-368); SaslAuthenticate v1+ tells the client its session lifetime."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ..auth import oauth
from ..auth.sasl import AuthFailed, IllegalState, SaslSession, SaslSettings, State, TokenRefused
from ..config import BrokerConfig, Listener
from ..connection import bad_input_log
from ..router import RequestContext, handler

if TYPE_CHECKING:   # the oauth extra
    from ..auth.oauth_jwks import SignedValidator

log = logging.getLogger("semel.broker.auth")


def sasl_settings(config: BrokerConfig, listener: Listener,
                  oauth_signed: SignedValidator | None = None) -> SaslSettings:
    """The SASL rules of a listener, from the broker config (and the broker's signed
    OAUTHBEARER validator when it has one)."""
    return SaslSettings(tuple(config.sasl_enabled_mechanisms), config.max_reauth_ms(listener.name),
                        oauth.validator_config(config), oauth_signed)


def _session(ctx: RequestContext) -> SaslSession | None:
    conn = ctx.connection
    listener = ctx.listener
    if listener is None or not listener.sasl:
        return None
    if conn.session is None:
        conn.session = SaslSession(ctx.services.users, sasl_settings(ctx.services.config, listener,
                                                                   ctx.services.oauth_signed))
    return conn.session


@handler(ApiKey.SASL_HANDSHAKE, 1, 1)
async def sasl_handshake(ctx: RequestContext, body: Any) -> Any:
    enabled = list(ctx.services.config.sasl_enabled_mechanisms)
    session = _session(ctx)
    if session is None:
        return ctx.response(error_code=KafkaError.ILLEGAL_SASL_STATE, mechanisms=[])
    reauth = session.state is State.AUTHENTICATED
    try:
        session.handshake(body.mechanism)
    except IllegalState:
        ctx.connection.closing = True
        return ctx.response(error_code=KafkaError.ILLEGAL_SASL_STATE, mechanisms=enabled)
    except LookupError:
        mech = str(body.mechanism)[:40]
        why = f"re-authentication with {mech!r} instead of {session.mechanism!r}" if reauth \
            else f"unsupported mechanism {mech!r}"
        _failed(ctx, mech, why)
        ctx.connection.closing = True
        return ctx.response(error_code=KafkaError.UNSUPPORTED_SASL_MECHANISM, mechanisms=enabled)
    return ctx.response(error_code=KafkaError.NONE, mechanisms=enabled)


@handler(ApiKey.SASL_AUTHENTICATE, 0, 2)
async def sasl_authenticate(ctx: RequestContext, body: Any) -> Any:
    session = _session(ctx)
    if session is None:
        ctx.connection.closing = True
        return _auth_response(ctx, KafkaError.ILLEGAL_SASL_STATE, "not a SASL listener")
    reauth = session.previous is not None
    auth_bytes = bytes(body.auth_bytes or b"")
    signed = session.settings.oauth_signed
    if signed is not None and session.mechanism == "OAUTHBEARER" and session.state is State.MECHANISM:
        await signed.prepare(auth_bytes)   # an unknown kid may fetch the JWKS again (off the loop)
    try:
        out = session.authenticate(auth_bytes)
    except IllegalState as exc:
        ctx.connection.closing = True
        return _auth_response(ctx, KafkaError.ILLEGAL_SASL_STATE, str(exc))
    except TokenRefused as exc:   # RFC 7628: the error goes back as a challenge, the client ends it
        _failed(ctx, session.mechanism, f"token refused: {exc}")
        return _auth_response(ctx, KafkaError.NONE, None, exc.challenge)
    except AuthFailed as exc:
        if not exc.counted:
            _failed(ctx, session.mechanism, f"user {session.user!r}: {exc.__cause__ or exc}")
        ctx.connection.closing = True
        return _auth_response(ctx, KafkaError.SASL_AUTHENTICATION_FAILED, str(exc))
    if session.principal is not None:
        ctx.connection.principal = session.principal
        if reauth:
            ctx.services.metrics.reauthentications.labels(session.mechanism).inc()
            log.info("%s re-authenticated as %s (%s), session lifetime %d ms", ctx.peer, session.principal,
                     session.mechanism, session.lifetime_ms)
        else:
            log.info("%s authenticated as %s (%s)", ctx.peer, session.principal, session.mechanism)
    return _auth_response(ctx, KafkaError.NONE, None, out, session.lifetime_ms)


def _auth_response(ctx: RequestContext, code: KafkaError, message: str | None, token: bytes = b"",
                   lifetime_ms: int = 0) -> Any:
    # session_lifetime_ms is a v1+ field: a v0 client is not told, its connection just
    # closes at expiry (KIP-368).
    return ctx.response(error_code=code, error_message=message, auth_bytes=token, session_lifetime_ms=lifetime_ms)


def _failed(ctx: RequestContext, mechanism: str | None, why: str) -> None:
    # The label is an enabled mechanism or "unsupported": a client naming made-up
    # mechanisms must not grow the metric by a series each.
    label = mechanism if mechanism in ctx.services.config.sasl_enabled_mechanisms else "unsupported"
    ctx.services.metrics.failed_logins.labels(label).inc()
    bad_input_log.warning("failed login from %s (%s): %s", ctx.peer, mechanism, why)

"""Server side of SASL/PLAIN, SCRAM-SHA-256/512 and OAUTHBEARER for one connection,
with KIP-368 re-authentication.

The exchange is a transition table (state, event) -> state that the session
consults before doing anything: a request out of order is ILLEGAL_SASL_STATE and
the connection is closed, as Kafka does. SCRAM's message handling is scramp's;
OAUTHBEARER's token rules are in oauth.py (unsecured) and oauth_jwks.py (signed).

Re-authentication (KIP-368): with a session lifetime (Kafka's
connections.max.reauth.ms on the listener), an authenticated session expires that
long after the login (sooner when an OAUTHBEARER token expires first); the client
starts a new SaslHandshake on the same connection before then. A re-login must keep
the mechanism and the principal; it checks the credentials as they are now, so a
changed password or a deleted user fails it and the connection is closed."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

import scramp

from . import oauth
from .users import AuthInfo, CredentialReader

if TYPE_CHECKING:
    from .oauth_jwks import SignedValidator

log = logging.getLogger("semel.broker.auth")


class State(Enum):
    START = "start"                  # nothing yet (ApiVersions may come and go)
    MECHANISM = "mechanism"          # SaslHandshake chose a mechanism
    SCRAM_CHALLENGED = "challenged"  # SCRAM: client-first answered, waiting for client-final
    OAUTH_REFUSED = "refused"        # OAUTHBEARER: error challenge sent, waiting for the client's \x01
    AUTHENTICATED = "authenticated"
    FAILED = "failed"                # the connection is being closed


# (state, event) -> next state; events: handshake, plain, scram_first, scram_final,
# oauth, oauth_refused, fail. A handshake on an AUTHENTICATED session starts a re-login.
TRANSITIONS = {
    (State.START, "handshake"): State.MECHANISM,
    (State.AUTHENTICATED, "handshake"): State.MECHANISM,
    (State.MECHANISM, "plain"): State.AUTHENTICATED,
    (State.MECHANISM, "oauth"): State.AUTHENTICATED,
    (State.MECHANISM, "oauth_refused"): State.OAUTH_REFUSED,
    (State.MECHANISM, "scram_first"): State.SCRAM_CHALLENGED,
    (State.SCRAM_CHALLENGED, "scram_final"): State.AUTHENTICATED,
    (State.START, "fail"): State.FAILED,
    (State.MECHANISM, "fail"): State.FAILED,
    (State.SCRAM_CHALLENGED, "fail"): State.FAILED,
    (State.OAUTH_REFUSED, "fail"): State.FAILED,
    (State.AUTHENTICATED, "fail"): State.FAILED,   # a re-login with another mechanism or principal
}


class IllegalState(Exception):
    pass


class AuthFailed(Exception):
    """Wrong password, unknown user or a malformed token: SASL_AUTHENTICATION_FAILED.
    `counted`: the failed login was already counted (OAUTHBEARER's refused token)."""

    def __init__(self, message: str, counted: bool = False):
        super().__init__(message)
        self.counted = counted


class TokenRefused(Exception):
    """OAUTHBEARER: answer `challenge` (error code NONE); the client's next message ends it."""

    def __init__(self, reason: str, challenge: bytes):
        super().__init__(reason)
        self.challenge = challenge


@dataclass(frozen=True)
class SaslSettings:
    """What a listener's SASL sessions follow (from BrokerConfig)."""
    enabled: tuple[str, ...]
    max_reauth_ms: int = 0          # Kafka's connections.max.reauth.ms; 0: sessions never expire
    oauth: oauth.ValidatorConfig = field(default_factory=oauth.ValidatorConfig)
    # set when a JWKS is configured: signed tokens only.
    oauth_signed: SignedValidator | None = None


class SaslSession:
    def __init__(self, users: CredentialReader, settings: SaslSettings | tuple[str, ...]):
        self.users = users
        self.settings = settings if isinstance(settings, SaslSettings) else SaslSettings(tuple(settings))
        self.enabled = self.settings.enabled
        self.state = State.START
        self.mechanism: str | None = None
        self.user: str | None = None
        self._scram: Any = None   # a scramp.ScramServer during a SCRAM exchange (scramp has no type hints)
        self._refused: str | None = None           # OAUTHBEARER: why the token was refused
        self._credential_expires_ms: int | None = None   # OAUTHBEARER: the token's exp
        # The login being renewed (principal, mechanism) while re-authenticating.
        self.previous: tuple[str | None, str | None] | None = None
        self.lifetime_ms = 0                    # the answer's session_lifetime_ms
        self.expires_at: float | None = None    # time.monotonic() past which requests close the connection
        self.logins = 0                         # successful logins on this connection (2+: re-authentications)

    def _move(self, event: str) -> None:
        nxt = TRANSITIONS.get((self.state, event))
        if nxt is None:
            raise IllegalState(f"{event} not allowed in state {self.state.value}")
        self.state = nxt

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def handshake(self, mechanism: str) -> None:
        if (self.state, "handshake") not in TRANSITIONS:
            raise IllegalState(f"handshake not allowed in state {self.state.value}")
        reauth = self.state is State.AUTHENTICATED
        if reauth and self.expires_at is None:   # as Kafka: no re-login where sessions never expire
            raise IllegalState("re-authentication is not enabled (connections.max.reauth.ms is 0)")
        if mechanism not in self.enabled or (reauth and mechanism != self.mechanism):
            self._move("fail")
            raise LookupError(mechanism)
        if reauth:
            self.previous = (self.principal, self.mechanism)
            self.user, self._scram, self._credential_expires_ms = None, None, None
        self._move("handshake")
        self.mechanism = mechanism

    def authenticate(self, token: bytes) -> bytes:
        """One SaslAuthenticate round: returns the server's bytes; AuthFailed or
        IllegalState move the session to FAILED (the caller closes); TokenRefused
        answers an OAUTHBEARER error challenge."""
        if self.state not in (State.MECHANISM, State.SCRAM_CHALLENGED, State.OAUTH_REFUSED):
            raise IllegalState(f"authenticate not allowed in state {self.state.value}")
        try:
            if self.mechanism == "PLAIN":
                out = self._plain(token)
            elif self.mechanism == "OAUTHBEARER":
                out = self._oauth(token)
            else:
                out = self._scram_step(token)
            if self.principal is not None:   # the step authenticated
                self._logged_in()
            return out
        except AuthFailed:
            self._move("fail")
            raise

    def _logged_in(self) -> None:
        if self.previous is not None and self.previous[0] != self.principal:
            raise AuthFailed(f"Cannot change principals during re-authentication from {self.previous[0]}: "
                             f"{self.principal}")
        self.previous = None
        self.logins += 1
        limit = self.settings.max_reauth_ms
        if limit <= 0:   # re-authentication off: sessions (and tokens, once accepted) never expire
            self.lifetime_ms, self.expires_at = 0, None
            return
        lifetime = limit
        if self._credential_expires_ms is not None:
            lifetime = max(1, min(lifetime, self._credential_expires_ms - int(time.time() * 1000)))
        self.lifetime_ms = lifetime
        self.expires_at = time.monotonic() + lifetime / 1000

    def _plain(self, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthFailed("malformed PLAIN token")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise AuthFailed("PLAIN token is not UTF-8") from None
        if authzid and authzid != user:
            raise AuthFailed("authorization id differs from the user")
        if not self.users.check_password(user, password):
            self.user = user
            raise AuthFailed("Authentication failed: Invalid username or password")
        self.user = user
        self._move("plain")
        return b""

    def _oauth(self, message: bytes) -> bytes:
        if self.state is State.OAUTH_REFUSED:   # the client's \x01 (or anything) after the error challenge
            raise AuthFailed(f"Authentication failed: {self._refused}", counted=True)
        try:
            authzid, token = oauth.parse_initial_response(message)
            now_ms = int(time.time() * 1000)
            signed = self.settings.oauth_signed
            claims = signed.validate(token, now_ms) if signed is not None else \
                oauth.validate_unsecured(token, self.settings.oauth, now_ms)
        except oauth.MalformedResponse as exc:
            raise AuthFailed("Authentication failed during authentication due to invalid credentials with "
                             "SASL mechanism OAUTHBEARER") from exc
        except oauth.TokenRefused as exc:
            self._refused = str(exc)
            self._move("oauth_refused")
            raise TokenRefused(str(exc), exc.challenge()) from None
        self.user = claims.principal
        if authzid is not None and authzid != claims.principal:
            raise AuthFailed("Authentication failed: Client requested an authorization id that is different "
                             "from the token's principal name")
        self._credential_expires_ms = claims.expires_ms
        self._move("oauth")
        return b""

    def _scram_step(self, token: bytes) -> bytes:
        mech = self.mechanism
        if mech is None:
            raise IllegalState("SCRAM step before a handshake")
        try:
            text = token.decode("utf-8")
            if self.state is State.MECHANISM:
                def auth_fn(username: str) -> AuthInfo:
                    self.user = str(username)
                    info = self.users.auth_info(username, mech)
                    if info is None:
                        raise AuthFailed("unknown user")
                    return info
                self._scram = scramp.ScramMechanism(mech).make_server(auth_fn)
                self._scram.set_client_first(text)
                out: str = self._scram.get_server_first()
                self._move("scram_first")
                return out.encode()
            self._scram.set_client_final(text)
            out = self._scram.get_server_final()
        except AuthFailed:
            raise
        except (scramp.ScramException, UnicodeDecodeError, ValueError, KeyError, IndexError) as exc:
            raise AuthFailed(f"Authentication failed during authentication due to invalid credentials "
                             f"with SASL mechanism {mech}") from exc
        self._move("scram_final")
        return out.encode()

    @property
    def principal(self) -> str | None:
        return f"User:{self.user}" if self.state is State.AUTHENTICATED else None


class LoggedIn(Protocol):
    """What session_expired reads of a connection (semel.broker.session.Connection,
    which imports this module)."""
    session: SaslSession | None
    peer: str
    principal: str | None


def session_expired(conn: LoggedIn) -> bool:
    """Has the connection's SASL login outlived its session (KIP-368)? Kafka then
    closes the connection at any request but a re-login's SaslHandshake/SaslAuthenticate."""
    session = conn.session
    if session is None or session.expires_at is None or time.monotonic() < session.expires_at:
        return False
    log.info("closing %s: the SASL session of %s expired (connections.max.reauth.ms %d ms) without a "
             "re-authentication", conn.peer, conn.principal, session.settings.max_reauth_ms)
    return True

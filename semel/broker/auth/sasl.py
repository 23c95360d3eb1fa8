"""Server side of SASL/PLAIN and SCRAM-SHA-256/512 for one connection.

The exchange is a transition table (state, event) -> state that the session
consults before doing anything: a request out of order is ILLEGAL_SASL_STATE and
the connection is closed, as Kafka does. SCRAM's message handling is scramp's."""
from __future__ import annotations

from enum import Enum

import scramp

from .users import UserStore


class State(Enum):
    START = "start"                  # nothing yet (ApiVersions may come and go)
    MECHANISM = "mechanism"          # SaslHandshake chose a mechanism
    SCRAM_CHALLENGED = "challenged"  # SCRAM: client-first answered, waiting for client-final
    AUTHENTICATED = "authenticated"
    FAILED = "failed"                # the connection is being closed


# (state, event) -> next state; events: handshake, plain, scram_first, scram_final, fail.
TRANSITIONS = {
    (State.START, "handshake"): State.MECHANISM,
    (State.MECHANISM, "plain"): State.AUTHENTICATED,
    (State.MECHANISM, "scram_first"): State.SCRAM_CHALLENGED,
    (State.SCRAM_CHALLENGED, "scram_final"): State.AUTHENTICATED,
    (State.START, "fail"): State.FAILED,
    (State.MECHANISM, "fail"): State.FAILED,
    (State.SCRAM_CHALLENGED, "fail"): State.FAILED,
}


class IllegalState(Exception):
    pass


class AuthFailed(Exception):
    """Wrong password, unknown user or a malformed token: SASL_AUTHENTICATION_FAILED."""


class SaslSession:
    def __init__(self, users: UserStore, enabled: tuple[str, ...]):
        self.users = users
        self.enabled = enabled
        self.state = State.START
        self.mechanism: str | None = None
        self.user: str | None = None
        self._scram = None

    def _move(self, event: str) -> None:
        nxt = TRANSITIONS.get((self.state, event))
        if nxt is None:
            raise IllegalState(f"{event} not allowed in state {self.state.value}")
        self.state = nxt

    def handshake(self, mechanism: str) -> None:
        if self.state is not State.START:
            raise IllegalState(f"handshake not allowed in state {self.state.value}")
        if mechanism not in self.enabled:
            self._move("fail")
            raise LookupError(mechanism)
        self._move("handshake")
        self.mechanism = mechanism

    def authenticate(self, token: bytes) -> bytes:
        """One SaslAuthenticate round: returns the server's bytes; AuthFailed or
        IllegalState move the session to FAILED (the caller closes)."""
        if self.state not in (State.MECHANISM, State.SCRAM_CHALLENGED):
            raise IllegalState(f"authenticate not allowed in state {self.state.value}")
        try:
            if self.mechanism == "PLAIN":
                return self._plain(token)
            return self._scram_step(token)
        except AuthFailed:
            self._move("fail")
            raise

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
            raise AuthFailed(f"Authentication failed: Invalid username or password")
        self.user = user
        self._move("plain")
        return b""

    def _scram_step(self, token: bytes) -> bytes:
        mech = self.mechanism
        try:
            text = token.decode("utf-8")
            if self.state is State.MECHANISM:
                def auth_fn(username):
                    self.user = str(username)
                    info = self.users.auth_info(username, mech)
                    if info is None:
                        raise AuthFailed("unknown user")
                    return info
                self._scram = scramp.ScramMechanism(mech).make_server(auth_fn)
                self._scram.set_client_first(text)
                out = self._scram.get_server_first()
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

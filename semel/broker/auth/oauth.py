"""SASL/OAUTHBEARER (RFC 7628, Kafka's KIP-255) with Kafka's default token validator:
unsecured JWS tokens (`alg` "none", no signature), the rules of Kafka's
OAuthBearerUnsecuredJws and its validation utilities.

An unsecured token proves nothing: whoever connects can name any `sub`. The
mechanism is off unless listed in `--sasl-mechanisms`, and meant for development
and tests, as in Kafka (docs/security.md). With a JWKS configured the signed
validator (oauth_jwks.py, KIP-768) replaces this one and shares its claim rules
(check_claims).

The client's first message is `n,[a=AUTHZID],\x01auth=Bearer TOKEN\x01[KEY=VALUE\x01]*\x01`.
A message that does not parse fails at once; a token that parses but is refused
(malformed JWS, expired, no `sub`, missing scope) is answered, as Kafka does, with an
RFC 7628 error challenge (`{"status": "invalid_token"}`), after which the client
sends `\x01` and the exchange fails with SASL_AUTHENTICATION_FAILED."""
from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import BrokerConfig

SEP = "\x01"
# Kafka's grammar (OAuthBearerClientInitialResponse): SASL name (ASCII but ',' and '=',
# which are written =2C and =3D), key/value pairs, the token.
_SASLNAME = r"(?:[\x02-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+"
_KEY = r"[A-Za-z]+"
_VALUE = r"[\x21-\x7E \t\r\n]+"
_INITIAL = re.compile(rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,{SEP}"
                      rf"(?P<kvpairs>(?:{_KEY}={_VALUE}{SEP})*){SEP}")
_AUTH = re.compile(r"(?P<scheme>\w+) +(?P<token>[-_.a-zA-Z0-9]+)")
# A JWS header or claims set: a JSON object
Claims = dict[str, Any]


class TokenRefused(Exception):
    """The token parsed but fails validation: `status` goes in the error challenge."""

    def __init__(self, reason: str, status: str = "invalid_token", scope: str | None = None):
        super().__init__(reason)
        self.status = status
        self.scope = scope

    def challenge(self) -> bytes:
        doc = {"status": self.status}
        if self.scope:
            doc["scope"] = self.scope
        return json.dumps(doc, separators=(",", ":")).encode()


class MalformedResponse(Exception):
    """The client's message is not an OAUTHBEARER initial response."""


@dataclass(frozen=True)
class ValidatorConfig:
    """Kafka's unsecuredValidator* options."""
    principal_claim: str = "sub"
    scope_claim: str = "scope"
    required_scope: tuple[str, ...] = ()
    allowable_clock_skew_ms: int = 0


def validator_config(config: BrokerConfig) -> ValidatorConfig:
    """The claim rules from a BrokerConfig. The clock skew left unset is Kafka's default
    of the validator in use: 0 for unsecured tokens, 30 s for signed ones."""
    skew = config.sasl_oauthbearer_clock_skew_ms
    if skew is None:
        skew = 30_000 if config.sasl_oauthbearer_jwks else 0
    return ValidatorConfig(config.sasl_oauthbearer_principal_claim, config.sasl_oauthbearer_scope_claim,
                           tuple(config.sasl_oauthbearer_required_scope), skew)


@dataclass(frozen=True)
class Token:
    principal: str
    expires_ms: int
    scope: frozenset[str]


def parse_initial_response(data: bytes) -> tuple[str | None, str]:
    """(authzid or None, token) of the client's first message; MalformedResponse else."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedResponse("not UTF-8") from None
    m = _INITIAL.fullmatch(text)
    if m is None:
        raise MalformedResponse("not an OAUTHBEARER client initial response")
    pairs = {}
    for item in m.group("kvpairs").split(SEP)[:-1]:
        key, _, value = item.partition("=")
        pairs[key] = value
    auth = _AUTH.fullmatch(pairs.get("auth", ""))
    if auth is None or auth.group("scheme").lower() != "bearer":
        raise MalformedResponse("no 'auth=Bearer <token>' in the client initial response")
    authzid = m.group("authzid")
    if authzid is not None:
        authzid = authzid.replace("=2C", ",").replace("=3D", "=")
    # Other keys are SASL extensions: Kafka's unsecured validator accepts and ignores them.
    return authzid, auth.group("token")


def _b64url_json(part: str, what: str) -> Claims:
    try:
        raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        doc = json.loads(raw.decode("utf-8"))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise TokenRefused(f"the JWS {what} is not Base64URL-encoded JSON") from None
    if not isinstance(doc, dict):
        raise TokenRefused(f"the JWS {what} is not a JSON object")
    return doc


def _number_ms(claims: Claims, name: str) -> int | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TokenRefused(f"claim {name!r} is not a number")
    return int(round(value * 1000))   # NumericDate: seconds, maybe fractional


def _scope_of(claims: Claims, name: str) -> frozenset[str]:
    value = claims.get(name)
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return frozenset(value)
    raise TokenRefused(f"claim {name!r} is neither a string nor a list of strings")


def validate_unsecured(token: str, cfg: ValidatorConfig, now_ms: int) -> Token:
    """Kafka's checks of an unsecured JWS, in its order; TokenRefused on the first failure."""
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenRefused("an unsecured JWS has 3 dot-separated Base64URL values")
    if parts[2]:
        raise TokenRefused("an unsecured JWS has an empty signature")
    header = _b64url_json(parts[0], "header")
    claims = _b64url_json(parts[1], "payload")
    if header.get("alg") != "none":
        raise TokenRefused("an unsecured JWS has alg 'none'")
    return check_claims(claims, cfg, now_ms)


def check_claims(claims: Claims, cfg: ValidatorConfig, now_ms: int) -> Token:
    """The claim rules both validators share (the signed one first checks the signature,
    issuer, audience and nbf): principal, exp, iat, scope."""
    principal = claims.get(cfg.principal_claim)
    if not isinstance(principal, str) or not principal.strip():
        raise TokenRefused(f"required claim {cfg.principal_claim!r} is missing or not a non-empty string")
    expires = _number_ms(claims, "exp")
    if expires is None:
        raise TokenRefused("required claim 'exp' is missing")
    issued = _number_ms(claims, "iat")
    skew = cfg.allowable_clock_skew_ms
    if issued is not None and now_ms + skew < issued:
        raise TokenRefused(f"the token is not valid yet (iat {issued} ms > now {now_ms} ms + skew {skew} ms)")
    if now_ms - skew >= expires:
        raise TokenRefused(f"the token expired (exp {expires} ms <= now {now_ms} ms - skew {skew} ms)")
    if issued is not None and expires <= issued:
        raise TokenRefused("the token's expiration time is not after its issued-at time")
    scope = _scope_of(claims, cfg.scope_claim)
    missing = [s for s in cfg.required_scope if s not in scope]
    if missing:
        raise TokenRefused(f"the token lacks the required scope {' '.join(missing)!r}",
                           status="insufficient_scope", scope=" ".join(cfg.required_scope))
    return Token(principal, expires, scope)


def not_before_ms(claims: Claims) -> int | None:
    """The token's nbf in ms (None without one); TokenRefused when it is not a number."""
    return _number_ms(claims, "nbf")


def unsecured_token(claims: Claims) -> str:
    """An unsecured JWS carrying `claims` (tests and tools; the broker only validates)."""
    def enc(doc: Claims) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()
    return f"{enc({'alg': 'none'})}.{enc(claims)}."


def initial_response(token: str, authzid: str | None = None, **extensions: str) -> bytes:
    """The client's first OAUTHBEARER message for `token`."""
    gs2 = "n," + (f"a={authzid.replace('=', '=3D').replace(',', '=2C')}" if authzid else "") + ","
    kv = "".join(f"{k}={v}{SEP}" for k, v in {"auth": f"Bearer {token}", **extensions}.items())
    return f"{gs2}{SEP}{kv}{SEP}".encode()

"""Signed OAUTHBEARER tokens: Kafka's KIP-768 broker validator (OAuthBearerValidatorCallbackHandler).

A token is a JWS signed by the identity provider (IdP) with an asymmetric key that the
IdP publishes as a JWKS (RFC 7517), read from a file or an http(s) URL (Kafka's
sasl.oauthbearer.jwks.endpoint.url). The token's `kid` header names the key. Only
asymmetric algorithms are accepted (RS256/384/512, PS256/384/512, ES256/384/512): a
token with `alg` none (the unsecured kind) or HMAC (which would let anyone holding the
public key sign) is refused, as is one whose `alg` does not fit the key it names.

The key set is fetched off the event loop, kept, and fetched again every
refresh period and when a token names a kid the set lacks; such on-demand fetches
are spaced at least `unknown_kid_refresh_ms` apart, so a flood of made-up kids
costs the IdP one request per interval. A failed fetch keeps the keys already
loaded and is logged; only the first one, at broker start, is fatal.

PyJWT (the 'oauth' extra) checks signatures, issuer and audience; the time and
principal/scope rules are the ones the unsecured validator applies (oauth.check_claims),
read against the broker's clock with the allowed skew, plus `nbf`."""
from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import jwt
from jwt.exceptions import PyJWTError
from jwt.types import Options

from . import oauth
from .oauth import Claims, TokenRefused

if TYPE_CHECKING:
    from ..config import BrokerConfig

log = logging.getLogger("semel.broker.auth")

# alg -> (the JWK key type it needs, the EC curve it needs or None)
ALGORITHMS: dict[str, tuple[str, str | None]] = {
    **{f"RS{n}": ("RSA", None) for n in (256, 384, 512)},
    **{f"PS{n}": ("RSA", None) for n in (256, 384, 512)},
    "ES256": ("EC", "P-256"), "ES384": ("EC", "P-384"), "ES512": ("EC", "P-521"),
}
MAX_JWKS_BYTES = 1 << 20      # a key set is a few KiB; more is not a JWKS
KID_IN_LOGS = 80              # a kid comes from the client: cut before it reaches a log line


class JwksError(Exception):
    """The key set could not be read or holds no usable key."""


@dataclass(frozen=True)
class SignedConfig:
    """Kafka's sasl.oauthbearer.* options of the signed validator (defaults as Kafka's)."""
    jwks: str                                    # file path, file:// URL or http(s):// URL
    expected_audience: tuple[str, ...] = ()      # none: the audience is not checked
    expected_issuer: str | None = None           # None: the issuer is not checked
    refresh_ms: int = 3_600_000                  # jwks.endpoint.refresh.ms
    retry_backoff_ms: int = 100                  # jwks.endpoint.retry.backoff.ms
    retry_backoff_max_ms: int = 10_000           # jwks.endpoint.retry.backoff.max.ms
    unknown_kid_refresh_ms: int = 10_000         # least time between fetches for unknown kids
    fetch_timeout_s: float = 10.0


@dataclass(frozen=True)
class VerificationKey:
    kid: str
    kty: str
    crv: str | None
    alg: str | None      # the JWK's own alg, when it names one
    key: Any             # a cryptography public key


# --- the key set ---------------------------------------------------------------

def parse_jwks(raw: bytes) -> dict[str, VerificationKey]:
    """kid -> key of every usable signing key in a JWKS document; JwksError when none is."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise JwksError("not a JSON document") from None
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(keys, list):
        raise JwksError("no 'keys' list")
    out: dict[str, VerificationKey] = {}
    for jwk in keys:
        key = _verification_key(jwk)
        if key is not None:
            out[key.kid] = key
    if not out:
        raise JwksError(f"none of its {len(keys)} keys is a public RSA or EC signing key with a kid")
    return out


def _verification_key(jwk: Any) -> VerificationKey | None:
    """The key, or None for one this validator never uses (logged at debug: an IdP may
    publish encryption keys or other kinds beside its signing keys)."""
    if not isinstance(jwk, dict):
        return None
    kid, kty, alg = jwk.get("kid"), jwk.get("kty"), jwk.get("alg")
    why = None
    if not isinstance(kid, str) or not kid:
        why = "no kid"
    elif kty not in ("RSA", "EC"):
        why = f"kty {kty!r}"
    elif jwk.get("use", "sig") != "sig":
        why = f"use {jwk.get('use')!r}"
    elif alg is not None and (alg not in ALGORITHMS or ALGORITHMS[alg][0] != kty):
        why = f"alg {alg!r}"
    elif "d" in jwk:   # a private key has no place in a published set
        why = "a private key"
    if why is None:
        try:
            key = jwt.PyJWK(jwk).key
        except PyJWTError as exc:
            why = str(exc)
    if why is not None:
        log.debug("JWKS: skipping key %r: %s", str(kid)[:KID_IN_LOGS], why)
        return None
    return VerificationKey(str(kid), str(kty), jwk.get("crv"), alg, key)


class JwksSource:
    """Where the key set comes from; `fetch` blocks (run it off the event loop)."""

    def __init__(self, spec: str, timeout_s: float = 10.0):
        self.spec = spec
        self.timeout_s = timeout_s
        scheme = urllib.parse.urlsplit(spec).scheme.lower()
        self.url = spec if scheme in ("http", "https") else None
        if scheme == "file":
            self.path: Path | None = Path(urllib.request.url2pathname(urllib.parse.urlsplit(spec).path))
        elif self.url is None:
            if scheme and len(scheme) > 1:   # (a one-letter scheme is a Windows drive)
                raise ValueError(f"JWKS source {spec!r}: a file path or an http(s):// or file:// URL")
            self.path = Path(spec)
        else:
            self.path = None

    def fetch(self) -> bytes:
        """The JWKS document's bytes; OSError (urllib's errors are OSErrors) or JwksError."""
        if self.path is not None:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_JWKS_BYTES + 1)
        elif self.url is not None:
            req = urllib.request.Request(self.url, headers={"Accept": "application/json"})
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read(MAX_JWKS_BYTES + 1)
        else:
            raise JwksError(f"{self.spec}: neither a file nor a URL")
        if len(raw) > MAX_JWKS_BYTES:
            raise JwksError(f"larger than {MAX_JWKS_BYTES} bytes")
        return raw


def fetch_keys(source: JwksSource, cfg: SignedConfig,
               sleep: Callable[[float], None] = time.sleep) -> dict[str, VerificationKey]:
    """Fetch and parse the set, retrying an http(s) source with Kafka's exponential
    backoff (retry_backoff_ms doubling, retry_backoff_max_ms in all); blocking."""
    waited, delay = 0, cfg.retry_backoff_ms
    while True:
        try:
            return parse_jwks(source.fetch())
        except (OSError, JwksError) as exc:
            if source.url is None or waited + delay > cfg.retry_backoff_max_ms:
                raise JwksError(f"{source.spec}: {exc}") from None
            log.info("JWKS %s: %s; retrying in %d ms", source.spec, exc, delay)
        sleep(delay / 1000)
        waited += delay
        delay *= 2


# kid -> key, and the blocking fetch of it
KeySet = dict[str, VerificationKey]
Fetch = Callable[[], KeySet]


class JwksCache:
    """The loaded keys and their refreshes. State changes happen on the event loop only
    (the fetch itself runs in a thread); at most one fetch is under way at a time, and
    callers asking meanwhile share its outcome."""

    def __init__(self, fetch: Fetch, cfg: SignedConfig,
                 clock: Callable[[], float] = time.monotonic,
                 run_blocking: Callable[[Fetch], Awaitable[KeySet]] = asyncio.to_thread,
                 describe: str = "JWKS"):
        self._fetch = fetch
        self.cfg = cfg
        self._clock = clock
        self._run_blocking = run_blocking
        self.describe = describe
        self.keys: dict[str, VerificationKey] = {}
        self._inflight: asyncio.Task[bool] | None = None
        self._last_on_demand = float("-inf")
        self.failures = 0            # consecutive failed fetches (the periodic retry's backoff)

    def load(self, keys: dict[str, VerificationKey]) -> None:
        """The first set (at start, fetched before the loop serves anyone)."""
        self.keys = keys

    def get(self, kid: str) -> VerificationKey | None:
        return self.keys.get(kid)

    async def refresh(self, why: str) -> bool:
        """Fetch the set now (or join the fetch under way); False when it failed."""
        if self._inflight is None:
            self._inflight = asyncio.get_running_loop().create_task(self._refresh(why), name="jwks-fetch")
        return await asyncio.shield(self._inflight)

    async def _refresh(self, why: str) -> bool:
        try:
            keys = await self._run_blocking(self._fetch)
        except Exception as exc:   # noqa: BLE001 - whatever failed, the loaded keys stay (and logins go on)
            self.failures += 1
            log.warning("JWKS refresh (%s) from %s failed, keeping the %d keys loaded: %s",
                        why, self.describe, len(self.keys), exc)
            return False
        finally:
            self._inflight = None
        self.failures = 0
        added, removed = keys.keys() - self.keys.keys(), self.keys.keys() - keys.keys()
        if added or removed:
            log.info("JWKS refresh (%s) from %s: kids added %s, removed %s", why, self.describe,
                     sorted(added), sorted(removed))
        self.keys = keys
        return True

    async def ensure(self, kid: str) -> None:
        """Before a token naming `kid` is checked: an unknown kid fetches the set again
        (or waits for the fetch under way), unless an on-demand fetch started less than
        unknown_kid_refresh_ms ago; the token is then checked against what is loaded."""
        if kid in self.keys:
            return
        if self._inflight is None:
            now = self._clock()
            if now - self._last_on_demand < self.cfg.unknown_kid_refresh_ms / 1000:
                return
            self._last_on_demand = now
        await self.refresh(f"unknown kid {kid[:KID_IN_LOGS]!r}")

    def next_delay_s(self) -> float:
        """Until the next periodic fetch: the refresh period, or the retry backoff
        (doubling, capped) after failed ones."""
        if self.failures == 0:
            return self.cfg.refresh_ms / 1000
        backoff: int = self.cfg.retry_backoff_ms * 2 ** min(self.failures - 1, 30)
        return min(backoff, self.cfg.retry_backoff_max_ms, self.cfg.refresh_ms) / 1000

    async def run(self) -> None:
        """The periodic refresh (a broker task, cancelled at stop)."""
        while True:
            await asyncio.sleep(self.next_delay_s())
            await self.refresh("periodic")


# --- the validator ----------------------------------------------------------------

class SignedValidator:
    """Checks a signed token: structure, algorithm, key (by kid), signature, issuer,
    audience, then the claim rules (nbf, exp, iat, principal, scope)."""

    def __init__(self, cfg: SignedConfig, claims: oauth.ValidatorConfig, keys: JwksCache):
        self.cfg = cfg
        self.claims = claims
        self.keys = keys

    async def prepare(self, message: bytes) -> None:
        """Before the (synchronous) check of a client's first message: make sure the
        key its token names is loaded if it can be. Anything unparsable is left to
        the check, which refuses it."""
        try:
            _, token = oauth.parse_initial_response(message)
            kid = jwt.get_unverified_header(token).get("kid")
        except (oauth.MalformedResponse, PyJWTError):
            return
        if isinstance(kid, str) and kid:
            await self.keys.ensure(kid)

    def validate(self, token: str, now_ms: int) -> oauth.Token:
        key, alg = self._key_for(token)
        claims = self._verified_claims(token, key, alg)
        nbf = oauth.not_before_ms(claims)
        skew = self.claims.allowable_clock_skew_ms
        if nbf is not None and now_ms + skew < nbf:
            raise TokenRefused(f"the token is not valid yet (nbf {nbf} ms > now {now_ms} ms + skew {skew} ms)")
        return oauth.check_claims(claims, self.claims, now_ms)

    def _key_for(self, token: str) -> tuple[VerificationKey, str]:
        try:
            header = jwt.get_unverified_header(token)
        except PyJWTError as exc:
            raise TokenRefused(f"malformed token: {exc}") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            named = f"alg {alg[:20]!r}" if isinstance(alg, str) else "no alg"
            raise TokenRefused(f"{named} is not accepted: a signed token (RS256/384/512, "
                               f"PS256/384/512, ES256/384/512) is required")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise TokenRefused("the token header names no key id (kid)")
        key = self.keys.get(kid)
        if key is None:
            raise TokenRefused(f"unknown key id (kid) {kid[:KID_IN_LOGS]!r}: not in the JWKS")
        kty, crv = ALGORITHMS[alg]
        if key.kty != kty or (crv is not None and key.crv != crv) or (key.alg is not None and key.alg != alg):
            raise TokenRefused(f"alg {alg} does not fit key {kid[:KID_IN_LOGS]!r} "
                               f"({key.kty}{' ' + key.crv if key.crv else ''}{', alg ' + key.alg if key.alg else ''})")
        return key, alg

    def _verified_claims(self, token: str, key: VerificationKey, alg: str) -> Claims:
        # PyJWT checks the signature, the issuer and the audience; times are ours (the
        # broker's clock and skew, the same rules as the unsecured validator).
        options: Options = {"verify_exp": False, "verify_nbf": False, "verify_iat": False, "verify_sub": False,
                   "verify_jti": False, "verify_aud": bool(self.cfg.expected_audience),
                   "verify_iss": self.cfg.expected_issuer is not None, "require": []}
        try:
            return jwt.decode(token, key.key, algorithms=[alg], options=options,
                              audience=list(self.cfg.expected_audience) or None, issuer=self.cfg.expected_issuer)
        except jwt.InvalidSignatureError:
            raise TokenRefused(f"bad signature (key {key.kid[:KID_IN_LOGS]!r}, {alg})") from None
        except jwt.InvalidIssuerError:
            raise TokenRefused(f"wrong issuer: not {self.cfg.expected_issuer!r}") from None
        except jwt.InvalidAudienceError:
            raise TokenRefused(f"wrong audience: none of {list(self.cfg.expected_audience)}") from None
        except jwt.MissingRequiredClaimError as exc:
            what = {"iss": "wrong issuer", "aud": "wrong audience"}.get(exc.claim, "malformed token")
            raise TokenRefused(f"{what}: no {exc.claim!r} claim") from None
        except PyJWTError as exc:   # DecodeError and the like: not a well-formed JWS
            raise TokenRefused(f"malformed token: {exc}") from None


def signed_config(config: BrokerConfig) -> SignedConfig:
    """The signed validator's options from a BrokerConfig with a JWKS source."""
    if config.sasl_oauthbearer_jwks is None:
        raise ValueError("no OAUTHBEARER JWKS source configured")
    return SignedConfig(
        config.sasl_oauthbearer_jwks, tuple(config.sasl_oauthbearer_expected_audience),
        config.sasl_oauthbearer_expected_issuer, config.sasl_oauthbearer_jwks_refresh_ms,
        config.sasl_oauthbearer_jwks_retry_backoff_ms, config.sasl_oauthbearer_jwks_retry_backoff_max_ms,
        config.sasl_oauthbearer_jwks_unknown_kid_refresh_ms)


async def start_signed_validator(config: BrokerConfig) -> SignedValidator:
    """The validator of a BrokerConfig, its first key set loaded (off the loop);
    ValueError when that fails, so the broker refuses to start rather than refuse
    every login."""
    cfg = signed_config(config)
    source = JwksSource(cfg.jwks, cfg.fetch_timeout_s)
    try:
        keys = await asyncio.to_thread(fetch_keys, source, cfg)
    except JwksError as exc:
        raise ValueError(f"cannot load the OAUTHBEARER JWKS {exc}") from None
    cache = JwksCache(lambda: fetch_keys(source, cfg), cfg, describe=cfg.jwks)
    cache.load(keys)
    log.info("OAUTHBEARER: signed tokens, %d keys from %s (kids %s), issuer %s, audience %s",
             len(keys), cfg.jwks, sorted(keys), cfg.expected_issuer or "(not checked)",
             list(cfg.expected_audience) or "(not checked)")
    return SignedValidator(cfg, oauth.validator_config(config), cache)

"""Client-side security settings in Kafka's client configuration names, and the
connections they open (TLS, then a SASL login).

`from_config` reads Kafka's names (`security.protocol`, `sasl.mechanism`,
`sasl.jaas.config`, `ssl.truststore.*`, `ssl.keystore.*`, ...) into a `Security`
value: frozen, hashable (a connection pool keys on it), picklable (Spark ships it to
its workers; TLS contexts and OAuth tokens are made again in each process, never
pickled). Secrets live in `Secret`, whose str() and repr() never show the value, so
a Security, an options object holding one, or an error message built from either
cannot leak a password, a key or a JAAS line.

Trust and client certificates are PEM (files or inline text): Python's ssl module
reads nothing else. JKS and PKCS12 stores are refused with the command that turns
them into PEM.
"""
from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Mapping

from .client import Client, ClientError
from .sasl import authenticate

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")

# The login module each mechanism takes (Kafka's class names, package left out).
_MODULES = {"PLAIN": "PlainLoginModule", "SCRAM-SHA-256": "ScramLoginModule",
            "SCRAM-SHA-512": "ScramLoginModule", "OAUTHBEARER": "OAuthBearerLoginModule"}
_HANDLERS = ("OAuthBearerLoginCallbackHandler",)   # Kafka's client-credentials handler

PROTOCOL = "security.protocol"
MECHANISM = "sasl.mechanism"
JAAS = "sasl.jaas.config"
TOKEN_ENDPOINT = "sasl.oauthbearer.token.endpoint.url"
LOGIN_HANDLER = "sasl.login.callback.handler.class"
TRUST_TYPE = "ssl.truststore.type"
TRUST_LOCATION = "ssl.truststore.location"
TRUST_CERTS = "ssl.truststore.certificates"
TRUST_PASSWORD = "ssl.truststore.password"
KEY_TYPE = "ssl.keystore.type"
KEY_LOCATION = "ssl.keystore.location"
KEY_CHAIN = "ssl.keystore.certificate.chain"
KEY_KEY = "ssl.keystore.key"
KEY_STORE_PASSWORD = "ssl.keystore.password"
KEY_PASSWORD = "ssl.key.password"
ENDPOINT_ID = "ssl.endpoint.identification.algorithm"
TLS_PROTOCOL = "ssl.protocol"
TLS_ENABLED = "ssl.enabled.protocols"

# Every name from_config reads (lower case, as Kafka spells them).
CONFIG_NAMES = frozenset({PROTOCOL, MECHANISM, JAAS, TOKEN_ENDPOINT, LOGIN_HANDLER, TRUST_TYPE,
                          TRUST_LOCATION, TRUST_CERTS, TRUST_PASSWORD, KEY_TYPE, KEY_LOCATION, KEY_CHAIN,
                          KEY_KEY, KEY_STORE_PASSWORD, KEY_PASSWORD, ENDPOINT_ID, TLS_PROTOCOL, TLS_ENABLED})
# Values that must never be shown (in errors, logs, a Spark plan).
SECRET_NAMES = frozenset({JAAS, TRUST_PASSWORD, KEY_KEY, KEY_STORE_PASSWORD, KEY_PASSWORD})

_TLS_VERSIONS = {"TLSV1.2": ssl.TLSVersion.TLSv1_2, "TLSV1.3": ssl.TLSVersion.TLSv1_3, "TLS": None}


class SecurityError(ValueError):
    """A security setting that cannot be used; one line, never holding a secret."""


class Secret:
    """A value that prints as *** (str, repr, f-strings, tracebacks of dataclasses)."""

    __slots__ = ("value",)

    def __init__(self, value: str):
        self.value = value

    def __repr__(self) -> str:
        return "Secret(***)"

    __str__ = __repr__

    def __eq__(self, other) -> bool:
        return isinstance(other, Secret) and other.value == self.value

    def __hash__(self) -> int:
        return hash(("secret", self.value))

    def __reduce__(self):
        return (Secret, (self.value,))


# --- JAAS ---------------------------------------------------------------------------

def parse_jaas(text: str) -> tuple[str, dict[str, str]]:
    """Kafka's `sasl.jaas.config`: `LoginModuleClass FLAG key=value ... ;`, values bare
    or double-quoted with backslash escapes. Returns (class name, options). Errors say
    where, never what (the text holds a password)."""
    tokens = _jaas_tokens(text)
    if len(tokens) < 3 or tokens[-1] != (";", True):
        raise SecurityError(f"{JAAS}: expected 'LoginModuleClass required key=\"value\" ... ;'")
    (module, m_sym), (flag, f_sym), body = tokens[0], tokens[1], tokens[2:-1]
    if m_sym or f_sym or flag.lower() not in ("required", "requisite", "sufficient", "optional"):
        raise SecurityError(f"{JAAS}: expected a login module class and a flag (required) first")
    if (";", True) in body:
        raise SecurityError(f"{JAAS}: one login module only (a client takes one)")
    options: dict[str, str] = {}
    for i in range(0, len(body), 3):
        entry = body[i:i + 3]
        if len(entry) != 3 or entry[0][1] or entry[1] != ("=", True) or entry[2][1]:
            raise SecurityError(f"{JAAS}: option {len(options) + 1} is not key=value")
        options[entry[0][0]] = entry[2][0]
    return module, options


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}


def _jaas_tokens(text: str) -> list[tuple[str, bool]]:
    """(text, is_symbol): '=' and ';' are symbols unless quoted."""
    out: list[tuple[str, bool]] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in "=;":
            out.append((ch, True))
            i += 1
        elif ch in "\"'":
            quote, i, buf = ch, i + 1, []
            while True:
                if i >= n:
                    raise SecurityError(f"{JAAS}: a quoted value is not closed")
                c = text[i]
                if c == "\\" and i + 1 < n:
                    buf.append(_ESCAPES.get(text[i + 1], text[i + 1]))
                    i += 2
                elif c == quote:
                    i += 1
                    break
                else:
                    buf.append(c)
                    i += 1
            out.append(("".join(buf), False))
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in "=;\"'":
                j += 1
            out.append((text[i:j], False))
            i = j
    return out


# --- the settings -------------------------------------------------------------------

@dataclass(frozen=True)
class Tls:
    ca_file: str | None = None
    ca_pem: str | None = None
    cert_file: str | None = None          # chain, and the key too when key_pem is None
    cert_pem: str | None = None
    key_pem: Secret | None = None
    key_password: Secret | None = None
    check_hostname: bool = True
    min_version: str | None = None
    max_version: str | None = None

    def context(self) -> ssl.SSLContext:
        """This process's context for these settings (made once, then shared)."""
        with _lock:
            ctx = _contexts.get(self)
            if ctx is None:
                ctx = _contexts[self] = self._make()
            return ctx

    def _make(self) -> ssl.SSLContext:
        try:
            ctx = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_pem)
        except (ssl.SSLError, OSError) as exc:
            raise SecurityError(f"{TRUST_LOCATION if self.ca_file else TRUST_CERTS}: "
                                f"no PEM certificate could be read ({_reason(exc)})") from None
        ctx.check_hostname = self.check_hostname
        for attr, name in (("minimum_version", self.min_version), ("maximum_version", self.max_version)):
            if name is not None:
                setattr(ctx, attr, _TLS_VERSIONS[name])
        password = self.key_password.value if self.key_password else None
        if self.cert_file is not None:
            _load_chain(ctx, self.cert_file, None, password, KEY_LOCATION)
        elif self.cert_pem is not None:
            _load_inline_chain(ctx, self.cert_pem, self.key_pem.value if self.key_pem else "", password)
        return ctx


_lock = threading.Lock()
_contexts: dict[Tls, ssl.SSLContext] = {}


def _reason(exc: Exception) -> str:
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or type(exc).__name__


def _load_chain(ctx: ssl.SSLContext, certfile: str, keyfile: str | None, password: str | None, what: str) -> None:
    try:
        ctx.load_cert_chain(certfile, keyfile, password=password or None)
    except (ssl.SSLError, OSError) as exc:
        raise SecurityError(f"{what}: the client certificate and key could not be loaded ({_reason(exc)}; "
                            f"is the key encrypted with another {KEY_PASSWORD}?)") from None


def _load_inline_chain(ctx: ssl.SSLContext, chain: str, key: str, password: str | None) -> None:
    # ssl reads a certificate chain from files only: a private, short-lived copy.
    with tempfile.TemporaryDirectory(prefix="semel-tls-") as d:
        cert_path, key_path = os.path.join(d, "chain.pem"), os.path.join(d, "key.pem")
        for path, text in ((cert_path, chain), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        _load_chain(ctx, cert_path, key_path, password, f"{KEY_CHAIN} / {KEY_KEY}")


@dataclass(frozen=True)
class OAuth:
    """Where OAUTHBEARER tokens come from: a token endpoint (client credentials grant,
    Kafka's OAuthBearerLoginCallbackHandler) or, for tests, an unsecured token made
    here (Kafka's default login: unsecuredLoginStringClaim_sub=...)."""
    endpoint: str | None = None
    client_id: str | None = None
    client_secret: Secret | None = None
    scope: str | None = None
    claims: tuple[tuple[str, object], ...] = ()     # unsecured token
    lifetime_s: int = 3600

    def token(self) -> str:
        with _lock:
            hit = _tokens.get(self)
        if hit is not None and hit[1] - time.time() > 30:
            return hit[0]
        token, expires = self._fetch() if self.endpoint else self._unsecured()
        with _lock:
            _tokens[self] = (token, expires)
        return token

    def _unsecured(self) -> tuple[str, float]:
        now = time.time()
        claims = {"iat": int(now), "exp": int(now) + self.lifetime_s, **dict(self.claims)}

        def part(doc) -> str:
            return base64.urlsafe_b64encode(json.dumps(doc, separators=(",", ":")).encode()).rstrip(b"=").decode()
        return f"{part({'alg': 'none'})}.{part(claims)}.", now + self.lifetime_s

    def _fetch(self) -> tuple[str, float]:
        import urllib.parse
        import urllib.request   # here: its HTTP stack is most of this module's import, for OAuth alone
        form = {"grant_type": "client_credentials"}
        if self.scope:
            form["scope"] = self.scope
        basic = base64.b64encode(f"{urllib.parse.quote(self.client_id or '')}:"
                                 f"{urllib.parse.quote(self.client_secret.value if self.client_secret else '')}"
                                 .encode()).decode()
        req = urllib.request.Request(self.endpoint, data=urllib.parse.urlencode(form).encode(), method="POST",
                                     headers={"Authorization": f"Basic {basic}",
                                              "Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                doc = json.loads(resp.read())
            token = doc["access_token"]
        except Exception as exc:   # noqa: BLE001 - one line, whatever the HTTP client raised
            raise ClientError(f"OAUTHBEARER: no token from {TOKEN_ENDPOINT} {self.endpoint} "
                              f"({type(exc).__name__}: {getattr(exc, 'code', '') or getattr(exc, 'reason', '')})"
                              ) from None
        return token, time.time() + float(doc.get("expires_in", 300))


_tokens: dict[OAuth, tuple[str, float]] = {}


@dataclass(frozen=True)
class Security:
    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: Secret | None = None
    oauth: OAuth | None = None
    tls: Tls | None = None

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    def connect(self, address: str, client_id: str, timeout_s: float) -> Client:
        """A connection to `address`, TLS and logged in as these settings say."""
        c = Client(address, client_id=client_id, timeout_s=timeout_s,
                   ssl_context=self.tls.context() if self.tls is not None else None)
        if not self.sasl:
            return c
        try:
            secret = self.oauth.token() if self.oauth is not None else self.password.value
            authenticate(c, self.mechanism, self.username or "", secret)
        except BaseException:
            c.close()
            raise
        return c


PLAINTEXT = Security()


# --- from Kafka's configuration names -----------------------------------------------

def from_config(config: Mapping[str, str], prefix: str = "") -> Security:
    """The settings in a Kafka client configuration (names lower case, after `prefix`);
    SecurityError names the option and never shows a secret."""
    c = {k[len(prefix):]: str(v) for k, v in config.items() if k.startswith(prefix) and k[len(prefix):] in CONFIG_NAMES}

    def name(n: str) -> str:
        return prefix + n

    protocol = c.get(PROTOCOL, "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        raise SecurityError(f"option '{name(PROTOCOL)}' must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    tls = _tls(c, name) if protocol in ("SSL", "SASL_SSL") else None
    if protocol in ("SSL", "SASL_SSL") and tls is None:
        tls = Tls()
    if not protocol.startswith("SASL_"):
        return Security(protocol=protocol, tls=tls)
    mechanism = c.get(MECHANISM, "GSSAPI").strip().upper()
    if mechanism not in MECHANISMS:
        raise SecurityError(f"option '{name(MECHANISM)}': {mechanism} is not supported "
                            f"(use {', '.join(MECHANISMS)})")
    if not c.get(JAAS, "").strip():
        raise SecurityError(f"option '{name(JAAS)}' is required with {name(PROTOCOL)}={protocol}")
    module, opts = parse_jaas(c[JAAS])
    want = _MODULES[mechanism]
    if module.rsplit(".", 1)[-1] != want:
        raise SecurityError(f"option '{name(JAAS)}': {name(MECHANISM)}={mechanism} takes {want}, "
                            f"got {module.rsplit('.', 1)[-1]}")
    if mechanism == "OAUTHBEARER":
        return Security(protocol=protocol, mechanism=mechanism, oauth=_oauth(c, opts, name), tls=tls)
    missing = [k for k in ("username", "password") if k not in opts]
    if missing:
        raise SecurityError(f"option '{name(JAAS)}': {want} needs {' and '.join(missing)}")
    return Security(protocol=protocol, mechanism=mechanism, username=opts["username"],
                    password=Secret(opts["password"]), tls=tls)


def _oauth(c: dict[str, str], opts: dict[str, str], name) -> OAuth:
    handler = c.get(LOGIN_HANDLER, "").strip()
    if handler and handler.rsplit(".", 1)[-1] not in _HANDLERS:
        raise SecurityError(f"option '{name(LOGIN_HANDLER)}': only Kafka's {_HANDLERS[0]} is supported")
    endpoint = c.get(TOKEN_ENDPOINT, "").strip()
    if endpoint:
        if not endpoint.startswith(("https://", "http://")):
            raise SecurityError(f"option '{name(TOKEN_ENDPOINT)}' must be an http(s) URL")
        for k in ("clientId", "clientSecret"):
            if k not in opts:
                raise SecurityError(f"option '{name(JAAS)}': OAuthBearerLoginModule with a token endpoint "
                                    f"needs {k}")
        return OAuth(endpoint=endpoint, client_id=opts["clientId"], client_secret=Secret(opts["clientSecret"]),
                     scope=opts.get("scope"))
    claims: dict[str, object] = {}
    for k, v in opts.items():
        if k.startswith("unsecuredLoginStringClaim_"):
            claims[k.split("_", 1)[1]] = v
        elif k.startswith("unsecuredLoginNumberClaim_"):
            claims[k.split("_", 1)[1]] = _number(v, name(JAAS), k)
        elif k.startswith("unsecuredLoginListClaim_") and v:
            claims[k.split("_", 1)[1]] = tuple(x for x in v[1:].split(v[0]) if x)  # hashable
    if "sub" not in claims:
        raise SecurityError(f"option '{name(JAAS)}': OAuthBearerLoginModule needs "
                            f"'{name(TOKEN_ENDPOINT)}' or unsecuredLoginStringClaim_sub")
    lifetime = int(_number(opts.get("unsecuredLoginLifetimeSeconds", "3600"), name(JAAS),
                           "unsecuredLoginLifetimeSeconds"))
    return OAuth(claims=tuple(sorted(claims.items(), key=lambda kv: kv[0])), lifetime_s=lifetime)


def _number(v: str, option: str, key: str) -> float:
    try:
        f = float(v)
    except ValueError:
        raise SecurityError(f"option '{option}': {key} must be a number") from None
    return int(f) if f.is_integer() else f


_CONVERT = ("convert it to PEM (keytool -importkeystore -srckeystore STORE -destkeystore out.p12 "
            "-deststoretype PKCS12, then openssl pkcs12 -in out.p12 -out out.pem -nodes)")


def _store_type(c: dict[str, str], type_name: str, location: str, name) -> None:
    """Only PEM stores: a JKS or PKCS12 one (Kafka's default type is JKS) is refused."""
    kind = c.get(type_name, "").strip().upper()
    if kind and kind != "PEM":
        raise SecurityError(f"option '{name(type_name)}': {kind} stores are not supported, only PEM; {_CONVERT}")
    path = c.get(location, "").strip()
    if path and not kind:
        try:
            with open(path, "rb") as f:
                head = f.read(4096)
        except OSError as exc:
            raise SecurityError(f"option '{name(location)}': cannot read {path}: {exc.strerror}") from None
        if b"-----BEGIN" not in head:
            raise SecurityError(f"option '{name(location)}': {path} is not PEM (JKS or PKCS12?): "
                                f"set {name(type_name)}=PEM with a PEM file, or {_CONVERT}")


def _tls(c: dict[str, str], name) -> Tls:
    _store_type(c, TRUST_TYPE, TRUST_LOCATION, name)
    _store_type(c, KEY_TYPE, KEY_LOCATION, name)
    if c.get(TRUST_PASSWORD):
        raise SecurityError(f"option '{name(TRUST_PASSWORD)}' is for JKS/PKCS12 trust stores; a PEM one has none")
    if c.get(KEY_STORE_PASSWORD):
        raise SecurityError(f"option '{name(KEY_STORE_PASSWORD)}' is for JKS/PKCS12 key stores; "
                            f"an encrypted PEM key takes '{name(KEY_PASSWORD)}'")
    for a, b in ((TRUST_LOCATION, TRUST_CERTS), (KEY_LOCATION, KEY_CHAIN)):
        if c.get(a, "").strip() and c.get(b, "").strip():
            raise SecurityError(f"options '{name(a)}' and '{name(b)}': give one of them")
    chain, key = c.get(KEY_CHAIN, "").strip(), c.get(KEY_KEY, "").strip()
    if bool(chain) != bool(key):
        raise SecurityError(f"options '{name(KEY_CHAIN)}' and '{name(KEY_KEY)}' go together")
    algorithm = c.get(ENDPOINT_ID, "https").strip().lower()
    if algorithm not in ("", "https"):
        raise SecurityError(f"option '{name(ENDPOINT_ID)}' must be https or empty (no host name check)")
    low, high = _versions(c, name)
    return Tls(ca_file=c.get(TRUST_LOCATION, "").strip() or None,
               ca_pem=c.get(TRUST_CERTS, "").strip() or None,
               cert_file=c.get(KEY_LOCATION, "").strip() or None,
               cert_pem=chain or None, key_pem=Secret(key) if key else None,
               key_password=Secret(c[KEY_PASSWORD]) if c.get(KEY_PASSWORD) else None,
               check_hostname=algorithm == "https", min_version=low, max_version=high)


def _versions(c: dict[str, str], name) -> tuple[str | None, str | None]:
    """ssl.enabled.protocols as the lowest and highest TLS version. ssl.protocol (TLS,
    TLSv1.2, TLSv1.3) names the context's protocol family, as in Java: checked only."""
    for option in (TLS_PROTOCOL, TLS_ENABLED):
        bad = [v.strip() for v in c.get(option, "").split(",") if v.strip() and v.strip().upper() not in _TLS_VERSIONS]
        if bad:
            raise SecurityError(f"option '{name(option)}': {', '.join(bad)} not supported (TLSv1.2, TLSv1.3)")
    versions = [v.strip().upper() for v in c.get(TLS_ENABLED, "").split(",")
                if _TLS_VERSIONS.get(v.strip().upper()) is not None]
    if not versions:
        return None, None
    order = ["TLSV1.2", "TLSV1.3"]
    return min(versions, key=order.index), max(versions, key=order.index)

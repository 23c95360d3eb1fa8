"""Signed OAUTHBEARER tokens (KIP-768): every claim rule of the validator, the JWKS
parsing and sources, and the key cache's refreshes (a seeded model of interleaved
logins, periodic refreshes and fetch outcomes, invariants checked after every step)."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import random
import re

import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from semel.broker.auth import oauth
from semel.broker.auth.oauth import TokenRefused, ValidatorConfig, unsecured_token
from semel.broker.auth.oauth_jwks import (JwksCache, JwksError, JwksSource, SignedConfig, SignedValidator,
                                          fetch_keys, parse_jwks)
from semel.testing.certs import make_certs
from tests.support.jwks import AUDIENCE, ISSUER, JwksServer, claims, ec_key, jwks_doc, rsa_key

NOW = 1_800_000_000
NOW_MS = NOW * 1000
RSA = rsa_key("rsa-1")
EC = ec_key("ec-1")
EC384 = ec_key("ec-384", "ES384")


def validator(*keys, audience=(AUDIENCE,), issuer=ISSUER, **rules) -> SignedValidator:
    cfg = SignedConfig("unused.json", tuple(audience), issuer)
    cache = JwksCache(lambda: {}, cfg)
    cache.load(parse_jwks(jwks_doc(*(keys or (RSA, EC, EC384)))))
    return SignedValidator(cfg, ValidatorConfig(**rules), cache)


def c(**over):
    return claims(now=NOW, **over)


def refused(token, v=None, now_ms=NOW_MS) -> TokenRefused:
    with pytest.raises(TokenRefused) as exc:
        (v or validator()).validate(token, now_ms)
    return exc.value


@pytest.mark.parametrize("key", [RSA, rsa_key("ps", "PS384"), rsa_key("rs512", "RS512"), EC, EC384,
                                 ec_key("ec-521", "ES512")], ids=lambda k: k.alg)
def test_valid_token_of_every_algorithm_family(key):
    token = key.sign(c(scope="pay read", exp=NOW + 60))
    assert validator(key).validate(token, NOW_MS) == oauth.Token("alice", NOW_MS + 60_000,
                                                                 frozenset({"pay", "read"}))


def test_bad_signature():
    impostor = rsa_key(RSA.kid)   # same kid, another private key
    assert "bad signature" in str(refused(impostor.sign(c())))
    token = RSA.sign(c())
    head, body, sig = token.split(".")
    assert "bad signature" in str(refused(f"{head}.{b64(c(sub='admin'))}.{sig}"))


@pytest.mark.parametrize("over,why", [
    ({"exp": NOW}, "expired"), ({"exp": NOW - 100, "iat": NOW - 200}, "expired"), ({"exp": None}, "'exp' is missing"),
    ({"nbf": NOW + 1}, "not valid yet (nbf"), ({"iat": NOW + 1}, "not valid yet (iat"),
    ({"iss": "https://evil.test"}, "wrong issuer"), ({"iss": None}, "wrong issuer"),
    ({"aud": "other"}, "wrong audience"), ({"aud": ["x", "y"]}, "wrong audience"), ({"aud": None}, "wrong audience"),
    ({"sub": None}, "'sub'"), ({"sub": ""}, "'sub'"), ({"exp": "soon"}, "'exp'"), ({"nbf": "x"}, "'nbf'"),
])
def test_claim_rules(over, why):
    assert why in str(refused(RSA.sign(c(**over))))


def test_time_rules_with_clock_skew_exactly():
    v = validator(allowable_clock_skew_ms=30_000)
    v.validate(RSA.sign(c(exp=NOW - 29, iat=NOW - 100)), NOW_MS)
    v.validate(RSA.sign(c(nbf=NOW + 30, iat=NOW + 30)), NOW_MS)
    assert "expired" in str(refused(RSA.sign(c(exp=NOW - 30, iat=NOW - 100)), v))
    assert "nbf" in str(refused(RSA.sign(c(nbf=NOW + 31)), v))


def test_audience_list_and_unchecked_issuer_and_audience():
    v = validator(audience=("kafka", AUDIENCE))
    assert v.validate(RSA.sign(c(aud=["other", AUDIENCE])), NOW_MS).principal == "alice"
    loose = validator(audience=(), issuer=None)
    assert loose.validate(RSA.sign(c(aud="anything", iss="anyone")), NOW_MS).principal == "alice"


def test_sub_and_scope_claim_names_and_required_scope():
    v = validator(principal_claim="client_id", scope_claim="scp", required_scope=("pay",))
    assert v.validate(RSA.sign(c(client_id="svc", scp=["pay"])), NOW_MS).principal == "svc"
    exc = refused(RSA.sign(c(client_id="svc", scp="read")), v)
    assert json.loads(exc.challenge()) == {"status": "insufficient_scope", "scope": "pay"}
    assert "'client_id'" in str(refused(RSA.sign(c(scp="pay")), v))


def test_keys_by_kid_unknown_and_missing_kid():
    assert "unknown key id" in str(refused(rsa_key("nope").sign(c())))
    token = jwt.encode(c(), RSA.private, algorithm="RS256")   # no kid header
    assert "names no key id" in str(refused(token))


@pytest.mark.parametrize("make,why", [
    (lambda: unsecured_token(c()), "alg 'none'"),
    (lambda: with_header(RSA.sign(c()), alg="EdDSA"), "alg 'EdDSA'"),
    (lambda: with_header(RSA.sign(c()), alg=None), "no alg is not accepted"),
    (lambda: jwt.encode(c(), "s" * 32, algorithm="HS256", headers={"kid": RSA.kid}), "alg 'HS256'"),
    # the classic confusion: HMAC keyed with the published public key
    (lambda: _hmac_with_public_key(), "alg 'HS256'"),
    (lambda: with_header(RSA.sign(c()), alg="ES256"), "does not fit"),
    (lambda: with_header(EC.sign(c()), alg="RS256"), "does not fit"),
], ids=["unsecured", "eddsa", "no-alg", "hmac", "hmac-public-key", "es-header-on-rsa", "rs-header-on-ec"])
def test_only_asymmetric_algorithms_that_fit_the_key(make, why):
    assert why in str(refused(make()))


def b64(doc) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()


def with_header(token: str, **header) -> str:
    """`token` with its header fields changed (the signature no longer matters: the
    validator refuses before it checks one)."""
    head, body, sig = token.split(".")
    return f"{b64({**jwt.get_unverified_header(token), **header})}.{body}.{sig}"


def _hmac_with_public_key() -> str:
    pem = RSA.private.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo)
    head, body = b64({"alg": "HS256", "kid": RSA.kid}).encode(), b64(c()).encode()
    sig = base64.urlsafe_b64encode(hmac.new(pem, head + b"." + body, hashlib.sha256).digest()).rstrip(b"=")
    return (head + b"." + body + b"." + sig).decode()


def test_curve_and_pinned_jwk_alg_must_match_the_token():
    assert "does not fit" in str(refused(with_header(EC384.sign(c()), alg="ES256")))   # P-384 key, ES256 header
    pinned = rsa_key("pinned")   # JWK says RS256: a PS256 token by the same key is refused
    doc = {"keys": [{**pinned.jwk(), "alg": "RS256"}]}
    cfg = SignedConfig("x", (AUDIENCE,), ISSUER)
    cache = JwksCache(lambda: {}, cfg)
    cache.load(parse_jwks(json.dumps(doc).encode()))
    v = SignedValidator(cfg, ValidatorConfig(), cache)
    assert v.validate(pinned.sign(c()), NOW_MS).principal == "alice"
    assert "does not fit" in str(refused(pinned.sign(c(), alg="PS256"), v))


@pytest.mark.parametrize("token", ["", "a.b", "a.b.c", "***.***.***", "a.b.c.d"])
def test_malformed_tokens(token):
    exc = refused(token)
    assert "malformed" in str(exc) and json.loads(exc.challenge()) == {"status": "invalid_token"}


# --- the key set ---------------------------------------------------------------------

def test_parse_jwks_keeps_only_public_signing_keys_with_kid():
    usable = [RSA.jwk(), EC.jwk()]
    skipped = [{**rsa_key("enc").jwk(), "use": "enc"}, {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
               {k: v for k, v in RSA.jwk().items() if k != "kid"}, {**rsa_key("hs").jwk(), "alg": "HS256"},
               jwt.algorithms.RSAAlgorithm.to_jwk(RSA.private, as_dict=True) | {"kid": "private"},
               {"kty": "EC", "kid": "broken", "crv": "P-256", "x": "AA", "y": "AA"}, "not a key"]
    keys = parse_jwks(json.dumps({"keys": usable + skipped}).encode())
    assert sorted(keys) == ["ec-1", "rsa-1"]
    assert keys["ec-1"].crv == "P-256" and keys["rsa-1"].kty == "RSA"


@pytest.mark.parametrize("raw,why", [(b"nope", "not a JSON"), (b"[]", "no 'keys'"), (b'{"keys": 1}', "no 'keys'"),
                                     (b'{"keys": [{"kty": "oct", "kid": "a", "k": "AA"}]}', "none of its 1 keys")])
def test_parse_jwks_errors(raw, why):
    with pytest.raises(JwksError, match=why):
        parse_jwks(raw)


def test_sources_file_path_file_url_and_bad_scheme(tmp_path):
    path = tmp_path / "jwks.json"
    path.write_bytes(jwks_doc(RSA))
    assert parse_jwks(JwksSource(str(path)).fetch()).keys() == {"rsa-1"}
    assert parse_jwks(JwksSource(path.as_uri()).fetch()).keys() == {"rsa-1"}
    with pytest.raises(ValueError, match="http"):
        JwksSource("ftp://idp/jwks")
    with pytest.raises(OSError):
        JwksSource(str(tmp_path / "missing.json")).fetch()


def test_https_source_checks_the_idp_certificate(tmp_path, monkeypatch):
    ca, cert, key = make_certs(tmp_path)
    with JwksServer(jwks_doc(EC), tls=(cert, key)) as idp:
        with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
            JwksSource(idp.url, timeout_s=5).fetch()   # a private CA is not trusted by default
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))   # how an operator names it (docs/security.md)
        assert parse_jwks(JwksSource(idp.url, timeout_s=5).fetch()).keys() == {"ec-1"}
    assert idp.requests == 1   # the refused handshake never reached the handler


class FlakySource:
    def __init__(self, url, outcomes):
        self.url, self.spec, self.outcomes, self.calls = url, url or "file", list(outcomes), 0

    def fetch(self):
        self.calls += 1
        out = self.outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out


def test_fetch_retries_a_url_with_exponential_backoff_then_gives_up():
    cfg = SignedConfig("x", retry_backoff_ms=100, retry_backoff_max_ms=1000)
    sleeps = []
    src = FlakySource("http://idp", [OSError("down"), b"{}", jwks_doc(RSA)])
    assert fetch_keys(src, cfg, sleeps.append).keys() == {"rsa-1"}
    assert sleeps == [0.1, 0.2]
    sleeps.clear()
    src = FlakySource("http://idp", [OSError("down")] * 10)
    with pytest.raises(JwksError, match="down"):
        fetch_keys(src, cfg, sleeps.append)
    assert sleeps == [0.1, 0.2, 0.4] and src.calls == 4   # 100+200+400 <= 1000 < +800
    src = FlakySource(None, [OSError("no file")])   # a file is read once
    with pytest.raises(JwksError, match="no file"):
        fetch_keys(src, cfg, sleeps.append)
    assert src.calls == 1


def test_periodic_delay_backs_off_after_failures():
    cache = JwksCache(lambda: {}, SignedConfig("x", refresh_ms=60_000, retry_backoff_ms=100,
                                               retry_backoff_max_ms=1_000))
    delays = []
    for failures in range(6):
        cache.failures = failures
        delays.append(cache.next_delay_s())
    assert delays == [60, 0.1, 0.2, 0.4, 0.8, 1.0]


# --- the cache: a seeded model ----------------------------------------------------------

KIDS = [f"k{i}" for i in range(5)]
GAP_S = 10.0


class Model:
    """What the cache must do, step by step: the keys of the last successful fetch, one
    fetch at a time, unknown-kid fetches at least GAP_S apart."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.clock = 0.0
        self.pending: list[asyncio.Future] = []
        self.fetches = 0
        self.keys = {"k0"}
        self.last_on_demand = float("-inf")
        cfg = SignedConfig("x", unknown_kid_refresh_ms=int(GAP_S * 1000))
        self.cache = JwksCache(lambda: None, cfg, clock=lambda: self.clock, run_blocking=self.run_blocking)
        self.key = parse_jwks(jwks_doc(RSA))["rsa-1"]
        self.cache.load({"k0": self.key})
        self.tasks: list[asyncio.Task] = []

    def run_blocking(self, _fn):
        fut = asyncio.get_running_loop().create_future()
        self.pending.append(fut)
        self.fetches += 1
        return fut

    def inflight(self) -> bool:
        return any(not f.done() for f in self.pending)

    def step(self):
        op = self.rng.choice(["login", "login", "periodic", "ok", "fail", "tick"])
        if op == "login":
            kid = self.rng.choice(KIDS)
            if kid not in self.keys and not self.inflight() and self.clock - self.last_on_demand >= GAP_S:
                self.last_on_demand = self.clock
                self.expect_fetch = True
            self.tasks.append(asyncio.ensure_future(self.cache.ensure(kid)))
        elif op == "periodic":
            self.expect_fetch = not self.inflight()
            self.tasks.append(asyncio.ensure_future(self.cache.refresh("periodic")))
        elif op in ("ok", "fail") and self.inflight():
            fut = next(f for f in self.pending if not f.done())
            if op == "ok":
                self.keys = set(self.rng.sample(KIDS, self.rng.randint(1, len(KIDS))))
                fut.set_result({k: self.key for k in self.keys})
            else:
                fut.set_exception(self.rng.choice([OSError("IdP down"), JwksError("no usable key"), ValueError("odd")]))
        elif op == "tick":
            self.clock += self.rng.uniform(0, GAP_S * 0.6)


@pytest.mark.parametrize("seed", range(40))
def test_cache_model(seed):
    async def run():
        m = Model(seed)
        for _ in range(120):
            m.expect_fetch = False
            before = m.fetches
            m.step()
            for _ in range(5):
                await asyncio.sleep(0)
            assert m.fetches == before + (1 if m.expect_fetch else 0)
            assert sum(not f.done() for f in m.pending) <= 1            # one fetch at a time
            assert set(m.cache.keys) == m.keys                          # last good set, kept on failure
            assert (m.cache._inflight is not None) == m.inflight()
            stuck = [t for t in m.tasks if not t.done()]
            assert not stuck or m.inflight()                            # only waiting on a fetch
            for t in m.tasks:
                if t.done():
                    assert t.exception() is None
        for f in m.pending:
            if not f.done():
                f.set_exception(OSError("end"))
        await asyncio.gather(*m.tasks)
    asyncio.run(run())


def test_flood_of_unknown_kids_costs_one_fetch_per_interval():
    async def run():
        clock = [0.0]
        fetches = []
        key = parse_jwks(jwks_doc(RSA))["rsa-1"]

        async def run_blocking(fn):
            fetches.append(clock[0])
            return fn()
        cache = JwksCache(lambda: {"rsa-1": key}, SignedConfig("x", unknown_kid_refresh_ms=10_000),
                          clock=lambda: clock[0], run_blocking=run_blocking)
        for i in range(1000):
            await cache.ensure(f"bogus-{i}")
            clock[0] += 0.1   # 100 s in all
        assert len(fetches) == 10 and all(b - a >= 10 for a, b in zip(fetches, fetches[1:]))
    asyncio.run(run())


# --- the broker's flags ---------------------------------------------------------------

def broker_config(tmp_path, *flags):
    from semel.cli.broker import build_config
    from semel.cli.main import build_parser
    args = build_parser().parse_args(["broker", "start", "--data-dir", str(tmp_path / "d"), *flags])
    return build_config(args)


def test_flags_reach_the_validators(tmp_path):
    cfg = broker_config(tmp_path, "--sasl-mechanisms", "OAUTHBEARER", "--oauthbearer-jwks", "https://idp/jwks",
                        "--oauthbearer-expected-audience", "a, b", "--oauthbearer-expected-issuer", "https://idp",
                        "--oauthbearer-sub-claim", "client_id", "--oauthbearer-scope-claim", "scp",
                        "--oauthbearer-jwks-refresh-ms", "60000", "--oauthbearer-jwks-unknown-kid-refresh-ms", "0")
    from semel.broker.auth.oauth_jwks import signed_config
    assert signed_config(cfg) == SignedConfig("https://idp/jwks", ("a", "b"), "https://idp", refresh_ms=60_000,
                                              unknown_kid_refresh_ms=0)
    assert oauth.validator_config(cfg) == ValidatorConfig("client_id", "scp", (), 30_000)   # Kafka's signed skew
    cfg = broker_config(tmp_path, "--sasl-mechanisms", "OAUTHBEARER")
    assert cfg.sasl_oauthbearer_jwks is None and oauth.validator_config(cfg).allowable_clock_skew_ms == 0
    cfg = broker_config(tmp_path, "--sasl-mechanisms", "OAUTHBEARER", "--oauthbearer-jwks", "k.json",
                        "--oauthbearer-clock-skew-ms", "5")
    assert oauth.validator_config(cfg).allowable_clock_skew_ms == 5


@pytest.mark.parametrize("flags,why", [
    (["--oauthbearer-jwks", "k.json"], "needs OAUTHBEARER in --sasl-mechanisms"),
    (["--sasl-mechanisms", "OAUTHBEARER", "--oauthbearer-jwks", "ftp://idp/k"], "http(s)://"),
    (["--sasl-mechanisms", "OAUTHBEARER", "--oauthbearer-jwks", "k.json", "--oauthbearer-jwks-refresh-ms", "0"],
     "at least 1"),
    (["--sasl-mechanisms", "OAUTHBEARER", "--oauthbearer-jwks", "k.json", "--oauthbearer-jwks-retry-backoff-ms",
      "-1"], ">= 0"),
])
def test_bad_flags_are_one_line_errors(tmp_path, flags, why):
    from semel.cli.main import CliError
    with pytest.raises(CliError, match=re.escape(why)):
        broker_config(tmp_path, *flags)

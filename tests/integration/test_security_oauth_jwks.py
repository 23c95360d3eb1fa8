"""Signed OAUTHBEARER tokens (KIP-768) on a real broker process.

The module's broker reads its JWKS (an RSA and an EC key) from a file and expects an
issuer, an audience and the scope `kafka`; SCRAM is on too, for the admin who creates
topics and reads offsets back. Clients are unmodified confluent-kafka with an `oauth_cb`
returning tokens the test signs; the raw-socket cases check each refusal's challenge,
reason, failed-login count and closed connection. A second broker reads its JWKS over
http from a local http.server and picks up a rotated key without a restart."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import confluent_kafka as ck
import pytest

from semel.broker.auth.acl import (CLUSTER_NAME, AclBinding, AclStore, Operation, PatternType, Permission,
                                   ResourceType)
from semel.broker.auth.oauth import initial_response, unsecured_token
from semel.broker.auth.users import UserStore
from semel.launch.process import SemelBroker, free_port
from semel.protocol.errors import KafkaError
from tests.integration.test_security import Secured, produce
from tests.integration.test_ops_packaging import semel_plain
from tests.support import wait, wire
from tests.support.jwks import AUDIENCE, ISSUER, JwksServer, claims, ec_key, jwks_doc, rsa_key, write_jwks

RSA = rsa_key("rsa-2026")
EC = ec_key("ec-2026", "ES384")
SKEW_MS = 1000
ADMIN_PW = "admin-secret"


def acls(data, user="alice"):
    """alice may write and read topics jw-*, read groups jw-*, write idempotently."""
    AclStore(data).add([AclBinding(rtype, name, pattern, f"User:{user}", "*", op, Permission.ALLOW)
                        for rtype, name, pattern, op in (
                            (ResourceType.TOPIC, "jw-", PatternType.PREFIXED, Operation.WRITE),
                            (ResourceType.TOPIC, "jw-", PatternType.PREFIXED, Operation.READ),
                            (ResourceType.GROUP, "jw-", PatternType.PREFIXED, Operation.READ),
                            (ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL, Operation.IDEMPOTENT_WRITE))])


def signed_broker(d, jwks: str, *extra: str) -> tuple[SemelBroker, int]:
    data = d / "data"
    data.mkdir()
    UserStore(data).add("admin", ADMIN_PW)   # in-process: the CLI is tested in test_security.py
    acls(data)
    metrics_port = free_port()
    b = SemelBroker(data, log_path=d / "broker.log", extra_args=[
        "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanisms", "OAUTHBEARER,SCRAM-SHA-256",
        "--oauthbearer-jwks", jwks, "--oauthbearer-expected-issuer", ISSUER,
        "--oauthbearer-expected-audience", f"other,{AUDIENCE}", "--oauthbearer-clock-skew-ms", str(SKEW_MS),
        "--super-user", "User:admin", "--metrics-port", str(metrics_port), *extra])
    b.start()
    return b, metrics_port


@pytest.fixture(scope="module")
def sec(tmp_path_factory):
    d = tmp_path_factory.mktemp("jwks")
    b, metrics_port = signed_broker(d, str(write_jwks(d / "jwks.json", RSA, EC)),
                                    "--oauthbearer-required-scope", "kafka")
    s = Secured(b, 0, None, metrics_port)
    try:
        admin = ck.admin.AdminClient(scram(b))
        for f in admin.create_topics([ck.admin.NewTopic(t, 1) for t in ("jw-orders", "secret")]).values():
            f.result(30)
        del admin
        yield s
    finally:
        b.close()


def scram(broker, **extra):
    return {"bootstrap.servers": broker.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "admin", "sasl.password": ADMIN_PW, **extra}


def oauth(broker, make_token, **extra):
    """confluent-kafka with an oauth_cb handing out `make_token()` (a fresh one per call)."""
    def oauth_cb(_config):
        return make_token(), time.time() + 3600   # what the client believes; the broker decides
    return {"bootstrap.servers": broker.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER", "oauth_cb": oauth_cb, **extra}


def good(key=RSA, **over):
    return key.sign(claims(**{"scope": "kafka", **over}))


def end_offset(sec, topic) -> int:
    c = ck.Consumer(scram(sec.broker, **{"group.id": "jw-admin"}))
    try:
        return c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=30)[1]
    finally:
        c.close()


def failed_logins(sec) -> float:
    return sec.metric("semel_failed_logins_total", mechanism="OAUTHBEARER")


def oauth_login(bootstrap, token: str, corr=1):
    sock = wire.connect(bootstrap)
    assert wire.call(sock, 17, 1, corr=corr, mechanism="OAUTHBEARER").error_code == 0
    return sock, wire.call(sock, 36, 2, corr=corr + 1, auth_bytes=initial_response(token))


def refused_login(bootstrap, token: str) -> tuple[dict, str]:
    """(the RFC 7628 challenge, the final error message) of a refused token."""
    sock, resp = oauth_login(bootstrap, token)
    assert resp.error_code == 0 and resp.auth_bytes, "the token was not refused"
    final = wire.call(sock, 36, 2, corr=9, auth_bytes=b"\x01")
    assert final.error_code == KafkaError.SASL_AUTHENTICATION_FAILED
    assert wire.closed_by_peer(sock)
    return json.loads(resp.auth_bytes), final.error_message


# --- allowed ------------------------------------------------------------------------

def test_rsa_producer_and_ec_consumer_with_signed_tokens(sec):
    start = end_offset(sec, "jw-orders")
    assert produce(oauth(sec.broker, lambda: good(RSA), **{"enable.idempotence": True}), "jw-orders",
                   b"paid-1") is None
    c = ck.Consumer(oauth(sec.broker, lambda: good(EC), **{"group.id": "jw-reader",
                                                           "auto.offset.reset": "earliest"}))
    try:
        c.assign([ck.TopicPartition("jw-orders", 0, start)])
        got = []
        wait.until(lambda: _poll_into(c, got), "the EC-token consumer reads the record", timeout_s=60)
        assert got == [b"paid-1"]
    finally:
        c.close()
    assert end_offset(sec, "jw-orders") == start + 1


def _poll_into(consumer, out) -> bool:
    msg = consumer.poll(0.5)
    if msg is not None and msg.error() is None:
        out.append(msg.value())
    return bool(out)


def test_acls_apply_to_the_tokens_sub(sec):
    secret, start = end_offset(sec, "secret"), end_offset(sec, "jw-orders")
    err = produce(oauth(sec.broker, lambda: good(RSA)), "secret")   # alice has no ACL on it
    assert err is not None and err.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    err = produce(oauth(sec.broker, lambda: good(RSA, sub="mallory")), "jw-orders")   # mallory has none anywhere
    assert err is not None and err.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert end_offset(sec, "secret") == secret and end_offset(sec, "jw-orders") == start


def test_raw_login_with_a_signed_token(sec):
    sock, resp = oauth_login(sec.broker.bootstrap, good(EC))
    assert resp.error_code == 0 and resp.auth_bytes == b"" and resp.session_lifetime_ms == 0   # no re-auth limit
    assert wire.call(sock, 3, 1, corr=5, topics=None) is not None   # authenticated: Metadata answered


# --- refused -------------------------------------------------------------------------

IMPOSTOR = rsa_key(RSA.kid)   # the kid of a trusted key, another private key


@pytest.mark.parametrize("make,why", [
    (lambda: IMPOSTOR.sign(claims(scope="kafka")), "bad signature"),
    (lambda: good(exp=int(time.time()) - 60, iat=int(time.time()) - 120), "expired"),
    (lambda: good(nbf=int(time.time()) + 600), "not valid yet (nbf"),
    (lambda: good(iss="https://evil.test"), "wrong issuer"),
    (lambda: good(aud="payments"), "wrong audience"),
    (lambda: rsa_key("unknown-kid").sign(claims(scope="kafka")), "unknown key id"),
    (lambda: good(sub=None), "'sub'"),
    (lambda: good(EC, scope="read"), "required scope"),
    (lambda: unsecured_token(claims(scope="kafka")), "alg 'none'"),
    (lambda: "abc.def.ghi", "malformed token"),
], ids=["bad-signature", "expired", "nbf", "issuer", "audience", "unknown-kid", "no-sub", "scope", "unsecured",
        "malformed"])
def test_each_refusal_is_challenged_counted_and_logged(sec, make, why):
    failed = failed_logins(sec)
    challenge, message = refused_login(sec.broker.bootstrap, make())
    assert why in message
    assert challenge["status"] == ("insufficient_scope" if why == "required scope" else "invalid_token")
    assert failed_logins(sec) == failed + 1
    wait.until(lambda: why in sec.broker.log_path.read_text(), f"the broker logs the refusal ({why})", timeout_s=10)


@pytest.mark.parametrize("make", [lambda: IMPOSTOR.sign(claims(scope="kafka")),
                                  lambda: unsecured_token(claims(scope="kafka"))], ids=["forged", "unsecured"])
def test_confluent_kafka_with_a_refused_token_writes_nothing(sec, make):
    failed, start = failed_logins(sec), end_offset(sec, "jw-orders")
    errors = []
    p = ck.Producer(oauth(sec.broker, make, **{"error_cb": errors.append, "message.timeout.ms": 4000}))
    p.produce("jw-orders", b"forged")
    p.flush(10)
    assert any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors)
    assert failed_logins(sec) > failed
    assert end_offset(sec, "jw-orders") == start


# --- JWKS over http, key rotation ----------------------------------------------------------

UNKNOWN_KID_GAP_MS = 2000


def test_jwks_url_rotation_failed_refresh_and_a_flood_of_bogus_kids(tmp_path):
    old, new = rsa_key("2026-q1"), ec_key("2026-q2")
    with JwksServer(jwks_doc(old)) as idp:
        b, _ = signed_broker(tmp_path, idp.url, "--oauthbearer-jwks-unknown-kid-refresh-ms", str(UNKNOWN_KID_GAP_MS),
                             "--oauthbearer-jwks-retry-backoff-max-ms", "300", "--connections-max-reauth-ms", "600000")
        try:
            assert idp.requests == 1   # the first fetch, at start
            _, resp = oauth_login(b.bootstrap, old.sign(claims()))
            assert resp.error_code == 0 and resp.auth_bytes == b""
            # KIP-368: the session ends at the token's exp when that comes before the limit
            _, resp = oauth_login(b.bootstrap, old.sign(claims(exp=int(time.time()) + 5)))
            assert resp.error_code == 0 and 0 < resp.session_lifetime_ms <= 5000

            # The IdP is down when a token names a kid the broker does not know: refused,
            # logged, and the keys it had still work.
            idp.fail = True
            _, message = refused_login(b.bootstrap, new.sign(claims()))
            assert "unknown key id" in message
            wait.until(lambda: "keeping the 1 keys loaded" in b.log_path.read_text(), "the failed refresh is logged",
                       timeout_s=10)
            assert oauth_login(b.bootstrap, old.sign(claims()))[1].auth_bytes == b""

            # The IdP rotates its key: the new kid is fetched on first use, no restart.
            idp.fail, idp.doc = False, jwks_doc(new)
            fetched = idp.requests
            time.sleep(UNKNOWN_KID_GAP_MS / 1000 + 0.2)   # past the unknown-kid interval (no timing asserted)
            admin = ck.admin.AdminClient(scram(b))
            admin.create_topics([ck.admin.NewTopic("jw-rotated", 1)])["jw-rotated"].result(30)
            del admin
            assert produce(oauth(b, lambda: new.sign(claims())), "jw-rotated") is None
            assert idp.requests == fetched + 1   # one fetch, for the first login naming the new kid
            _, resp = oauth_login(b.bootstrap, new.sign(claims()))
            assert resp.error_code == 0 and resp.auth_bytes == b""
            _, message = refused_login(b.bootstrap, old.sign(claims()))   # the old key left the set
            assert "unknown key id" in message

            # Made-up kids: at most one fetch per interval, however many logins.
            before, t0 = idp.requests, time.monotonic()
            for i in range(30):
                refused_login(b.bootstrap, new.sign(claims(), kid=f"bogus-{i}"))
            elapsed_ms = (time.monotonic() - t0) * 1000
            assert idp.requests - before <= 1 + math.ceil(elapsed_ms / UNKNOWN_KID_GAP_MS)
            assert idp.requests - before < 30
        finally:
            b.close()


# --- start-up and packaging ---------------------------------------------------------

def test_broker_refuses_to_start_without_its_jwks(tmp_path):
    r = subprocess.run([sys.executable, "-m", "semel", "broker", "start", "--data-dir", str(tmp_path / "d"),
                        "--port", "0", "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanisms", "OAUTHBEARER",
                        "--oauthbearer-jwks", str(tmp_path / "missing.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "cannot load the OAUTHBEARER JWKS" in r.stderr and "missing.json" in r.stderr
    assert "semel broker ready" not in r.stdout


def test_jwks_needs_the_oauth_extra_and_oauthbearer(tmp_path):
    args = ["broker", "start", "--data-dir", str(tmp_path / "b"), "--sasl-mechanisms", "OAUTHBEARER",
            "--security-protocol", "SASL_PLAINTEXT"]
    r = semel_plain(*args, "--oauthbearer-jwks", str(tmp_path / "jwks.json"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "jwt" in r.stderr and "semel[oauth]" in r.stderr
    assert not (tmp_path / "b").exists()
    r = subprocess.run([sys.executable, "-m", "semel", *args[:-4], "--oauthbearer-jwks", "x.json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "needs OAUTHBEARER in --sasl-mechanisms" in r.stderr

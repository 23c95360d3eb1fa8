"""KIP-368 re-authentication and SASL/OAUTHBEARER (Kafka's unsecured JWS tokens).

One broker for the module: a SASL_PLAINTEXT listener with PLAIN, SCRAM-SHA-256 and
OAUTHBEARER, connections.max.reauth.ms 3 s, OAUTHBEARER clock skew 5 s. Clients are
unmodified confluent-kafka (librdkafka re-authenticates on its own and has a built-in
unsecured token) and kafka-python; the raw-socket cases check the exact codes, the
session lifetime and where the connection is closed."""
from __future__ import annotations

import json
import time
import urllib.request

import confluent_kafka as ck
import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaError as KPError
from kafka.net.sasl.oauth import AbstractTokenProvider

from semel.broker.auth.acl import (CLUSTER_NAME, AclBinding, AclStore, Operation, PatternType, Permission,
                                   ResourceType)
from semel.broker.auth.oauth import initial_response, unsecured_token
from semel.broker.auth.users import UserStore
from semel.launch.process import SemelBroker, free_port
from semel.protocol.errors import KafkaError
from tests.integration.test_security import Secured, add_user, produce, semel
from tests.support import wait, wire

REAUTH_MS = 3000
SKEW_MS = 5000
PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret", "carol": "carol-secret", "dave": "dave-secret",
             "erin": "erin-secret"}


@pytest.fixture(scope="module")
def sec(tmp_path_factory):
    d = tmp_path_factory.mktemp("reauth")
    data = d / "data"
    data.mkdir()
    users = UserStore(data)   # in-process: the CLI is tested in test_security.py
    for name, pw in PASSWORDS.items():
        users.add(name, pw)
    AclStore(data).add([AclBinding(rtype, name, pattern, f"User:{user}", "*", op, Permission.ALLOW)
                        for user in ("alice", "carol", "dave")
                        for rtype, name, pattern, op in (
                            (ResourceType.TOPIC, "ra-", PatternType.PREFIXED, Operation.WRITE),
                            (ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL, Operation.IDEMPOTENT_WRITE))])
    metrics_port = free_port()
    b = SemelBroker(data, log_path=d / "broker.log", extra_args=[
        "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanisms", "PLAIN,SCRAM-SHA-256,OAUTHBEARER",
        "--connections-max-reauth-ms", str(REAUTH_MS), "--oauthbearer-clock-skew-ms", str(SKEW_MS),
        "--super-user", "User:admin", "--metrics-port", str(metrics_port)])
    b.start()
    s = Secured(b, 0, None, metrics_port)
    try:
        admin = ck.admin.AdminClient(sasl(b, "admin"))
        for f in admin.create_topics([ck.admin.NewTopic(t, 1) for t in ("ra-long", "ra-cut", "ra-oauth",
                                                                          "secret")]).values():
            f.result(30)
        del admin
        yield s
    finally:
        b.close()


def sasl(broker, user, mechanism="SCRAM-SHA-256", **extra):
    return {"bootstrap.servers": broker.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": PASSWORDS[user], **extra}


def oauth_conf(broker, principal, **extra):
    """librdkafka's own unsecured token (sasl.oauthbearer.config), as Kafka's docs set it up."""
    return {"bootstrap.servers": broker.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": True,
            "sasl.oauthbearer.config": f"principal={principal} lifeSeconds=3600", **extra}


def end_offset(sec, topic) -> int:
    c = ck.Consumer(sasl(sec.broker, "admin", **{"group.id": "reauth-admin"}))
    try:
        return c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=30)[1]
    finally:
        c.close()


def reauths(sec, mechanism) -> float:
    return sec.metric("semel_successful_reauthentications_total", mechanism=mechanism)


def failed_logins(sec, mechanism) -> float:
    return sec.metric("semel_failed_logins_total", mechanism=mechanism)


# --- KIP-368 with confluent-kafka -------------------------------------------------

def test_producer_across_several_reauthentications_loses_nothing(sec):
    before, start = reauths(sec, "SCRAM-SHA-256"), end_offset(sec, "ra-long")
    p = ck.Producer(sasl(sec.broker, "carol", **{"enable.idempotence": True, "linger.ms": 5}))
    errors, sent = [], 0

    def keep_producing():
        nonlocal sent
        for _ in range(50):
            p.produce("ra-long", str(sent).encode(), on_delivery=lambda err, msg: err and errors.append(err))
            sent += 1
        p.poll(0.05)
        return reauths(sec, "SCRAM-SHA-256") >= before + 3   # three re-logins while records flow

    wait.until(keep_producing, "the producer re-authenticates three times while producing", timeout_s=90)
    assert p.flush(60) == 0
    assert errors == []
    assert end_offset(sec, "ra-long") == start + sent


def test_deleted_user_is_cut_at_its_next_reauthentication(sec):
    errors = []
    p = ck.Producer(sasl(sec.broker, "dave", **{"message.timeout.ms": 4000, "error_cb": errors.append}))
    assert produce_one(p, "ra-cut") is None
    failed = failed_logins(sec, "SCRAM-SHA-256")
    r = semel("user", "delete", "dave", data_dir=sec.data_dir)
    assert r.returncode == 0, r.stderr
    # The open connection keeps its login until the session ends; the re-login then fails.
    wait.until(lambda: p.poll(0.1) >= 0 and failed_logins(sec, "SCRAM-SHA-256") > failed,
               "dave's re-authentication is refused", timeout_s=60)
    start = end_offset(sec, "ra-cut")
    assert produce_one(p, "ra-cut") is not None
    assert end_offset(sec, "ra-cut") == start
    assert any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors)


def produce_one(p, topic):
    out = []
    p.produce(topic, b"v", on_delivery=lambda err, msg: out.append(err))
    p.flush(30)
    return out[0] if out else "not delivered"


# --- KIP-368 on the wire ------------------------------------------------------------

def plain_login(sock, user, password, version=2):
    assert wire.call(sock, 17, 1, mechanism="PLAIN").error_code == 0
    return wire.call(sock, 36, version, auth_bytes=f"\0{user}\0{password}".encode())


def test_session_lifetime_and_close_after_expiry(sec):
    sock = wire.connect(sec.broker.bootstrap)
    resp = plain_login(sock, "alice", PASSWORDS["alice"])
    assert resp.error_code == 0 and resp.session_lifetime_ms == REAUTH_MS
    assert wire.call(sock, 3, 1, topics=None) is not None
    time.sleep(REAUTH_MS / 1000 + 0.3)   # the session runs out (no timing asserted)
    assert wire.call(sock, 3, 1, corr=2, topics=None) is None
    assert wire.closed_by_peer(sock)


def test_v0_client_is_not_told_but_still_closed_at_expiry(sec):
    sock = wire.connect(sec.broker.bootstrap)
    assert plain_login(sock, "alice", PASSWORDS["alice"], version=0).error_code == 0
    time.sleep(REAUTH_MS / 1000 + 0.3)
    assert wire.call(sock, 18, 0, corr=2) is None   # not even ApiVersions after expiry
    assert wire.closed_by_peer(sock)


def test_reauthentication_in_time_keeps_the_connection(sec):
    before = reauths(sec, "PLAIN")
    sock = wire.connect(sec.broker.bootstrap)
    assert plain_login(sock, "alice", PASSWORDS["alice"]).error_code == 0
    time.sleep(REAUTH_MS / 1000 * 0.6)
    resp = plain_login(sock, "alice", PASSWORDS["alice"])
    assert resp.error_code == 0 and resp.session_lifetime_ms == REAUTH_MS
    time.sleep(REAUTH_MS / 1000 * 0.6)   # past the first session's end, inside the second's
    assert wire.call(sock, 3, 1, corr=9, topics=None) is not None
    assert reauths(sec, "PLAIN") == before + 1


def test_changed_password_fails_the_reauthentication(sec):
    sock = wire.connect(sec.broker.bootstrap)
    assert plain_login(sock, "erin", PASSWORDS["erin"]).error_code == 0
    add_user(sec.data_dir, "erin", "erin-new-secret")
    resp = plain_login(sock, "erin", PASSWORDS["erin"])
    assert resp.error_code == KafkaError.SASL_AUTHENTICATION_FAILED
    assert wire.closed_by_peer(sock)
    other = wire.connect(sec.broker.bootstrap)
    assert plain_login(other, "erin", "erin-new-secret").error_code == 0


def test_reauthentication_cannot_change_principal_or_mechanism(sec):
    sock = wire.connect(sec.broker.bootstrap)
    assert plain_login(sock, "alice", PASSWORDS["alice"]).error_code == 0
    resp = plain_login(sock, "carol", PASSWORDS["carol"])
    assert resp.error_code == KafkaError.SASL_AUTHENTICATION_FAILED
    assert "Cannot change principals" in resp.error_message
    assert wire.closed_by_peer(sock)
    sock = wire.connect(sec.broker.bootstrap)
    assert plain_login(sock, "alice", PASSWORDS["alice"]).error_code == 0
    assert wire.call(sock, 17, 1, mechanism="SCRAM-SHA-256").error_code == KafkaError.UNSUPPORTED_SASL_MECHANISM
    assert wire.closed_by_peer(sock)


# --- OAUTHBEARER ------------------------------------------------------------------

def token(**claims):
    now = time.time()
    return unsecured_token({"sub": "alice", "iat": now, "exp": now + 3600, **claims})


def oauth_login(sock, message: bytes):
    assert wire.call(sock, 17, 1, mechanism="OAUTHBEARER").error_code == 0
    return wire.call(sock, 36, 2, auth_bytes=message)


def test_confluent_kafka_unsecured_token_principal_is_sub(sec):
    start, secret = end_offset(sec, "ra-oauth"), end_offset(sec, "secret")
    assert produce(oauth_conf(sec.broker, "alice"), "ra-oauth") is None
    err = produce(oauth_conf(sec.broker, "alice"), "secret")   # ACLs apply to User:alice
    assert err is not None and err.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert end_offset(sec, "ra-oauth") == start + 1 and end_offset(sec, "secret") == secret


def test_confluent_kafka_expired_token_is_refused(sec):
    failed, start = failed_logins(sec, "OAUTHBEARER"), end_offset(sec, "ra-oauth")
    errors = []
    expired = token(exp=time.time() - 60, iat=time.time() - 120)

    def oauth_cb(_config):
        return expired, time.time() + 3600   # the client believes it; the broker does not

    conf = {"bootstrap.servers": sec.broker.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER", "oauth_cb": oauth_cb, "error_cb": errors.append,
            "message.timeout.ms": 4000}
    p = ck.Producer(conf)
    p.produce("ra-oauth", b"v")
    p.flush(10)
    assert any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors)
    assert failed_logins(sec, "OAUTHBEARER") > failed
    assert end_offset(sec, "ra-oauth") == start


class Provider(AbstractTokenProvider):
    def __init__(self, value):
        super().__init__()
        self.value = value

    def token(self):
        return self.value


def test_kafka_python_oauthbearer_allowed_and_malformed(sec):
    start = end_offset(sec, "ra-oauth")
    conf = dict(bootstrap_servers=sec.broker.bootstrap, security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="OAUTHBEARER")
    p = KafkaProducer(**conf, sasl_oauth_token_provider=Provider(token()))
    try:
        p.send("ra-oauth", b"v").get(30)
    finally:
        p.close()
    assert end_offset(sec, "ra-oauth") == start + 1
    failed = failed_logins(sec, "OAUTHBEARER")
    with pytest.raises(KPError):
        bad = KafkaProducer(**conf, sasl_oauth_token_provider=Provider("not-a-jws"), max_block_ms=5000,
                            bootstrap_timeout_ms=5000)
        bad.close()
    assert failed_logins(sec, "OAUTHBEARER") > failed
    assert end_offset(sec, "ra-oauth") == start + 1


@pytest.mark.parametrize("claims,why", [   # claims(now), made when the test runs
    (lambda now: {"exp": now - 60, "iat": now - 120}, "expired"),
    (lambda now: {"sub": None}, "'sub'"),
    (lambda now: {"sub": 7}, "'sub'"),
    (lambda now: {"exp": "tomorrow"}, "'exp'"),
    (lambda now: {"exp": None}, "'exp'"),
    (lambda now: {"iat": now + 60}, "not valid yet"),
], ids=["expired", "no-sub", "sub-not-string", "exp-not-number", "no-exp", "iat-future"])
def test_refused_token_gets_rfc7628_challenge_then_failure(sec, claims, why):
    failed = failed_logins(sec, "OAUTHBEARER")
    sock = wire.connect(sec.broker.bootstrap)
    resp = oauth_login(sock, initial_response(token(**claims(time.time()))))
    assert resp.error_code == 0 and json.loads(resp.auth_bytes) == {"status": "invalid_token"}
    final = wire.call(sock, 36, 2, corr=3, auth_bytes=b"\x01")
    assert final.error_code == KafkaError.SASL_AUTHENTICATION_FAILED and why in final.error_message
    assert wire.closed_by_peer(sock)
    assert failed_logins(sec, "OAUTHBEARER") == failed + 1


@pytest.mark.parametrize("message", [
    b"garbage",
    b"n,,\x01auth=Basic abc\x01\x01",                   # not a Bearer token
    b"y,,\x01auth=Bearer a.b.\x01\x01",                 # channel binding flag
    b"n,,\x01auth=Bearer a.b.\x01",                     # no closing separator
])
def test_malformed_initial_response_fails_at_once(sec, message):
    sock = wire.connect(sec.broker.bootstrap)
    resp = oauth_login(sock, message)
    assert resp.error_code == KafkaError.SASL_AUTHENTICATION_FAILED
    assert wire.closed_by_peer(sock)


def test_token_within_clock_skew_and_lifetime_capped_by_exp(sec):
    sock = wire.connect(sec.broker.bootstrap)
    resp = oauth_login(sock, initial_response(token(exp=time.time() - 1, iat=time.time() - 60)))
    assert resp.error_code == 0 and resp.auth_bytes == b""   # expired 1 s ago, skew is 5 s
    assert resp.session_lifetime_ms == 1                      # already past exp: re-login at once
    sock = wire.connect(sec.broker.bootstrap)
    # exp on a whole millisecond: the broker reads its clock in whole milliseconds, so an
    # exp with a fraction rounded up could give 2001 when both fall in the same millisecond
    exp = (int(time.time() * 1000) + 2000) / 1000
    resp = oauth_login(sock, initial_response(token(exp=exp), authzid="alice", traceId="x1"))
    assert resp.error_code == 0, resp
    assert 0 < resp.session_lifetime_ms <= 2000 < REAUTH_MS, resp.session_lifetime_ms
    sock = wire.connect(sec.broker.bootstrap)
    resp = oauth_login(sock, initial_response(token(), authzid="bob"))   # authzid must be the sub
    assert resp.error_code == KafkaError.SASL_AUTHENTICATION_FAILED
    assert wire.closed_by_peer(sock)


def test_made_up_mechanisms_share_one_failed_login_series(sec):
    before = failed_logins(sec, "unsupported")
    for i in range(5):
        sock = wire.connect(sec.broker.bootstrap)
        resp = wire.call(sock, 17, 1, mechanism=f"MADE-UP-{i}")
        assert resp.error_code == KafkaError.UNSUPPORTED_SASL_MECHANISM
        assert wire.closed_by_peer(sock)
    text = urllib.request.urlopen(f"http://127.0.0.1:{sec.metrics_port}/metrics", timeout=10).read().decode()
    assert "MADE-UP" not in text
    assert failed_logins(sec, "unsupported") == before + 5

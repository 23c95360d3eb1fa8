"""mTLS: an SSL listener with --ssl-client-auth required. A client proves who
it is with a certificate signed by the configured CA; its subject is the principal
ACLs name ("User:CN=alice,OU=payments", as Kafka writes it). confluent-kafka clients,
one real broker; each denial is read back as the super user (end offsets unchanged)."""
from __future__ import annotations

import gc
import subprocess
import sys

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from semel.launch.process import SemelBroker, free_port
from semel.testing.certs import make_certs, make_client_cert

ADMIN, ALICE = "User:CN=admin,OU=payments", "User:CN=alice,OU=payments"


def semel(*args, data_dir=None):
    return subprocess.run([sys.executable, "-m", "semel", *args, *(["--data-dir", str(data_dir)] if data_dir else [])],
                          capture_output=True, text=True, timeout=120)


class Mtls:
    def __init__(self, broker, port, d):
        self.broker, self.port, self.d = broker, port, d
        self._admin = None

    def conf(self, who: str | None, **extra) -> dict:
        """confluent-kafka over TLS, presenting who's certificate (None: none)."""
        conf = {"bootstrap.servers": f"127.0.0.1:{self.port}", "security.protocol": "SSL",
                "ssl.ca.location": str(self.d / "ca.pem"), **extra}
        if who is not None:
            conf["ssl.certificate.location"] = str(self.d / f"{who}.pem")
            conf["ssl.key.location"] = str(self.d / f"{who}.key")
        return conf

    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.conf("admin"))
        return self._admin

    def end_offset(self, topic) -> int:
        c = ck.Consumer(self.conf("admin", **{"group.id": "admin-reader"}))
        try:
            return c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=30)[1]
        finally:
            c.close()

    def close_clients(self) -> None:
        self._admin = None
        gc.collect()


@pytest.fixture(scope="module")
def mtls(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtls")
    ca, cert, key = make_certs(d)
    for who in ("admin", "alice", "mallory"):
        make_client_cert(d, who)
    (d / "data").mkdir()
    r = semel("acl", "add", "--allow", ALICE, "--operation", "write", "--topic", "paid", data_dir=d / "data")
    assert r.returncode == 0, r.stderr
    port = free_port()
    b = SemelBroker(d / "data", log_path=d / "broker.log", extra_args=[
        "--listener", f"SSL://127.0.0.1:{port}", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key),
        "--ssl-client-auth", "required", "--ssl-cafile", str(ca), "--super-user", ADMIN])   # authorizer: auto
    b.start()
    m = Mtls(b, port, d)
    try:
        m.admin().create_topics([NewTopic("paid", 1)])["paid"].result(60)
        yield m
    finally:
        m.close_clients()
        b.close()


def produce(conf: dict, topic: str):
    """One record: None when delivered, else its KafkaError (or "not delivered")."""
    p = ck.Producer({"message.timeout.ms": 10000, **conf})
    out = []
    p.produce(topic, b"v", on_delivery=lambda err, msg: out.append(err))
    p.flush(30)
    return out[0] if out else "not delivered"


def test_the_certificate_subject_is_the_principal(mtls):
    before = mtls.end_offset("paid")
    assert produce(mtls.conf("alice"), "paid") is None
    err = produce(mtls.conf("mallory"), "paid")   # a valid certificate, but no ACL for CN=mallory
    assert err is not None and err.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert mtls.end_offset("paid") == before + 1
    log = mtls.broker.log_path.read_text()
    assert "denied User:CN=mallory,OU=payments" in log and "on TOPIC 'paid'" in log


def test_a_client_without_a_certificate_is_refused(mtls):
    before = mtls.end_offset("paid")
    err = produce(mtls.conf(None, **{"message.timeout.ms": 3000}), "paid")
    # refused in the TLS handshake: it never got as far as a request an ACL could deny
    assert err is not None and err.code() == ck.KafkaError._MSG_TIMED_OUT
    assert "User:ANONYMOUS" not in mtls.broker.log_path.read_text()
    assert mtls.end_offset("paid") == before


def test_client_auth_without_a_ca_is_one_line(tmp_path):
    ca, cert, key = make_certs(tmp_path)
    r = semel("broker", "start", "--port", "0", "--security-protocol", "SSL", "--ssl-certfile", str(cert),
              "--ssl-keyfile", str(key), "--ssl-client-auth", "required", data_dir=tmp_path / "data")
    assert r.returncode == 2
    assert "--ssl-cafile" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_subject_names_follow_rfc_2253():
    from types import SimpleNamespace

    from semel.broker.auth_check import certificate_principal
    from semel.broker.config import Listener

    def conn(subject, protocol="SSL"):
        transport = SimpleNamespace(get_extra_info=lambda name: {"subject": subject} if name == "peercert" else None)
        return SimpleNamespace(listener=Listener("SSL", "h", 1, protocol), transport=transport)
    subject = ((("countryName", "DE"),), (("organizationName", "Pay, Inc."),),
               (("commonName", "alice"), ("userId", "7")))
    assert certificate_principal(conn(subject)) == "User:CN=alice+UID=7,O=Pay\\, Inc.,C=DE"
    assert certificate_principal(conn(((("commonName", " #x "),),))) == "User:CN=\\ #x\\ "
    assert certificate_principal(conn(((("commonName", " "),),))) == "User:CN=\\ "
    assert certificate_principal(conn(subject, "SASL_SSL")) is None   # SASL names the principal there
    assert certificate_principal(conn(())) is None


def _cli(mtls, *flags):
    return semel("txn", "list", "--bootstrap", f"127.0.0.1:{mtls.port}", *flags)


def test_the_cli_talks_tls_with_a_client_certificate(mtls):
    d = mtls.d
    r = _cli(mtls, "--ssl-cafile", str(d / "ca.pem"), "--ssl-certfile", str(d / "admin.pem"),
             "--ssl-keyfile", str(d / "admin.key"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "transactional-id\tproducer-id\tstate"


def test_the_cli_says_what_is_wrong_with_tls_in_one_line(mtls, tmp_path):
    d = mtls.d
    other_ca = make_certs(tmp_path)[0]   # a CA that did not sign the broker's certificate
    r = _cli(mtls, "--ssl-cafile", str(other_ca), "--ssl-certfile", str(d / "admin.pem"),
             "--ssl-keyfile", str(d / "admin.key"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "broker's certificate was not accepted" in r.stderr and "Traceback" not in r.stderr
    r = _cli(mtls, "--ssl-cafile", str(d / "ca.pem"))   # no client certificate: the broker refuses
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "TLS" in r.stderr and "Traceback" not in r.stderr
    r = _cli(mtls, "--ssl-cafile", str(tmp_path / "missing.pem"))
    assert r.returncode == 2 and "cannot load --ssl-cafile" in r.stderr and len(r.stderr.strip().splitlines()) == 1

"""Security: SASL (PLAIN, SCRAM-SHA-256/512), a TLS listener, SCRAM users
managed by `semel user` while the broker runs, Kafka's ACLs on every operation.

One broker for the module: the --port listener is SASL_PLAINTEXT (kafka-python,
PLAIN), a second listener is SASL_SSL with a throwaway CA (confluent-kafka, SCRAM).
Each denied case is read back as the super user: logs and offsets unchanged."""
from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import urllib.request

import confluent_kafka as ck
import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   NewTopic, ResourcePatternType, ResourceType)
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError as KPError

from semel.launch.process import SemelBroker, free_port
from semel.protocol.errors import KafkaError
from tests.support import wait, wire
from semel.testing.certs import make_certs

PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}


def semel(*args, env=None, data_dir=None):
    return subprocess.run([sys.executable, "-m", "semel", *args, *(["--data-dir", str(data_dir)] if data_dir else [])],
                          capture_output=True, text=True, env=dict(os.environ, **(env or {})), timeout=120)


def add_user(data_dir, name, password):
    r = semel("user", "add", name, "--password-env", "SEMEL_PW", env={"SEMEL_PW": password}, data_dir=data_dir)
    assert r.returncode == 0, r.stderr


class Secured:
    def __init__(self, broker: SemelBroker, tls_port: int, ca, metrics_port: int):
        self.broker, self.tls_port, self.ca, self.metrics_port = broker, tls_port, ca, metrics_port
        self.data_dir = broker.data_dir
        self._admins: dict[str, AdminClient] = {}

    def scram(self, user, mechanism="SCRAM-SHA-256", password=None, **extra):
        """confluent-kafka config for SASL/SCRAM over TLS."""
        return {"bootstrap.servers": f"127.0.0.1:{self.tls_port}", "security.protocol": "SASL_SSL",
                "ssl.ca.location": str(self.ca), "sasl.mechanism": mechanism, "sasl.username": user,
                "sasl.password": password or PASSWORDS[user], **extra}

    def plain(self, user, password=None):
        """kafka-python settings for SASL/PLAIN on the plaintext listener."""
        return dict(bootstrap_servers=self.broker.bootstrap, security_protocol="SASL_PLAINTEXT",
                    sasl_mechanism="PLAIN", sasl_plain_username=user,
                    sasl_plain_password=password or PASSWORDS[user])

    def admin(self, user="admin"):
        # kept: a future of a destroyed AdminClient fails with _DESTROY
        if user not in self._admins:
            self._admins[user] = AdminClient(self.scram(user))
        return self._admins[user]

    def close_clients(self) -> None:
        """Destroys the kept admin clients while the broker still runs: left to the end
        of the session they went on reconnecting to the stopped listener and logging
        after pytest's summary."""
        self._admins.clear()
        gc.collect()   # librdkafka handles are destroyed (threads joined) when collected

    def metric(self, name: str, **labels) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and (not want or f"{{{want}}}" in line):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def acl(self, *args):
        r = semel("acl", "add", *args, data_dir=self.data_dir)
        assert r.returncode == 0, r.stderr

    def end_offset(self, topic, partition=0) -> int:
        c = ck.Consumer(self.scram("admin", **{"group.id": "admin-reader"}))
        try:
            return c.get_watermark_offsets(ck.TopicPartition(topic, partition), timeout=30)[1]
        finally:
            c.close()

    def committed(self, group, topic) -> int:
        c = ck.Consumer(self.scram("admin", **{"group.id": group}))
        try:
            return c.committed([ck.TopicPartition(topic, 0)], timeout=30)[0].offset
        finally:
            c.close()


@pytest.fixture(scope="module")
def sec(tmp_path_factory):
    d = tmp_path_factory.mktemp("security")
    data = d / "data"
    data.mkdir()
    for name, pw in PASSWORDS.items():
        add_user(data, name, pw)
    ca, cert, key = make_certs(d)
    tls_port, metrics_port = free_port(), free_port()
    b = SemelBroker(data, log_path=d / "broker.log", extra_args=[
        "--security-protocol", "SASL_PLAINTEXT", "--listener", f"SASL_SSL://127.0.0.1:{tls_port}",
        "--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--super-user", "User:admin",
        "--metrics-port", str(metrics_port), "--group-initial-rebalance-delay-ms", "0",
        "--group-min-session-timeout-ms", "1000"])
    threads_before = _os_threads()
    b.start()
    s = None
    try:
        wait.until(lambda: _listening(tls_port), "the SASL_SSL listener accepts connections")
        s = Secured(b, tls_port, ca, metrics_port)
        fs = s.admin().create_topics([NewTopic(t, 1) for t in ("paid", "secret", "txn-out")])
        for f in fs.values():
            f.result(30)
        yield s
    finally:
        if s is not None:
            s.close_clients()
        b.close()
    # Every client the tests made is gone with its threads (librdkafka's and kafka-python's).
    wait.until(lambda: _os_threads() <= threads_before, f"client threads end (had {threads_before})")


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _listening(port) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def produce(conf, topic, value=b"v", timeout=30):
    """One record: None when delivered, else the KafkaError (or "not delivered")."""
    p = ck.Producer({"message.timeout.ms": 15000, **conf})
    out = []
    p.produce(topic, value, on_delivery=lambda err, msg: out.append(err))
    try:
        p.flush(timeout)
    except (ck.KafkaException, SystemError) as exc:   # a fatal error (idempotence refused) surfaces here
        fatal = exc if isinstance(exc, ck.KafkaException) else exc.__cause__
        # The exception outlives this call (confluent-kafka keeps a reference to it when
        # the fatal error is raised inside a delivery callback): its traceback would keep
        # this frame, and so the producer, alive after the test, logging reconnects.
        for e in (exc, exc.__cause__, exc.__context__):
            if e is not None:
                e.__traceback__ = None
        return fatal.args[0]
    return out[0] if out else "not delivered"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_over_tls_produce_allowed_and_denied(sec, mechanism):
    sec.acl("--allow", "User:alice", "--operation", "write", "--topic", "paid")
    before_paid, before_secret = sec.end_offset("paid"), sec.end_offset("secret")
    assert produce(sec.scram("alice", mechanism), "paid") is None
    err = produce(sec.scram("alice", mechanism), "secret")
    assert err is not None and err.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert sec.end_offset("paid") == before_paid + 1
    assert sec.end_offset("secret") == before_secret


def test_acl_apis_on_the_wire(sec):
    binding = AclBinding(ResourceType.TOPIC, "wire-", ResourcePatternType.PREFIXED, "User:bob", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    sec.admin().create_acls([binding])[binding].result(30)
    filt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:bob", None,
                            AclOperation.ANY, AclPermissionType.ANY)
    assert binding in sec.admin().describe_acls(filt).result(30)
    # alice holds no Alter/Describe on the cluster: CLUSTER_AUTHORIZATION_FAILED, nothing stored
    other = AclBinding(ResourceType.TOPIC, "x", ResourcePatternType.LITERAL, "User:alice", "*",
                       AclOperation.ALL, AclPermissionType.ALLOW)
    with pytest.raises(ck.KafkaException) as denied:
        sec.admin("alice").create_acls([other])[other].result(30)
    assert denied.value.args[0].code() == ck.KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # DescribeAcls denied: librdkafka shows the refusal as an empty result; nothing is revealed
    denials = sec.metric("semel_authorization_denials_total", operation="DESCRIBE", resource_type="CLUSTER")
    assert sec.admin("alice").describe_acls(filt).result(30) == []
    assert sec.metric("semel_authorization_denials_total", operation="DESCRIBE", resource_type="CLUSTER") \
        == denials + 1
    assert other not in sec.admin().describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, "User:alice", None, AclOperation.ANY,
        AclPermissionType.ANY)).result(30)
    deleted = sec.admin().delete_acls([filt])[filt].result(30)
    assert deleted == [binding]
    assert sec.admin().describe_acls(filt).result(30) == []


def test_topic_create_and_delete(sec):
    fs = sec.admin("bob").create_topics([NewTopic("bob-made", 1)])
    with pytest.raises(ck.KafkaException) as denied:
        fs["bob-made"].result(30)
    assert denied.value.args[0].code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "bob-made" not in sec.admin().list_topics(timeout=30).topics
    sec.acl("--allow", "User:bob", "--operation", "create", "--topic", "bob-", "--prefixed")
    sec.admin("bob").create_topics([NewTopic("bob-made", 1)])["bob-made"].result(30)
    fs = sec.admin("bob").delete_topics(["bob-made"])
    with pytest.raises(ck.KafkaException) as denied:
        fs["bob-made"].result(30)
    assert denied.value.args[0].code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "bob-made" in sec.admin().list_topics(timeout=30).topics
    sec.acl("--allow", "User:bob", "--operation", "delete", "--topic", "bob-made")
    sec.admin("bob").delete_topics(["bob-made"])["bob-made"].result(30)


def test_metadata_hides_topics_without_describe(sec):
    md = sec.admin("bob").list_topics(timeout=30)
    assert "secret" not in md.topics and "paid" not in md.topics
    sec.acl("--allow", "User:bob", "--operation", "describe", "--topic", "paid")
    md = sec.admin("bob").list_topics(timeout=30)
    assert "paid" in md.topics and "secret" not in md.topics
    named = sec.admin("bob").list_topics("secret", timeout=30).topics["secret"]
    assert named.error is not None and named.error.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_plain_consumer_group_read_allowed_and_denied(sec):
    p = KafkaProducer(**sec.plain("admin"))
    for i in range(3):
        p.send("paid", b"m%d" % i).get(timeout=30)
    p.close()
    sec.acl("--allow", "User:bob", "--operation", "read", "--topic", "paid")
    sec.acl("--allow", "User:bob", "--operation", "read", "--group", "bob-group")
    end = sec.end_offset("paid")   # earlier tests wrote to "paid" too
    c = KafkaConsumer("paid", group_id="bob-group", auto_offset_reset="earliest", enable_auto_commit=False,
                      consumer_timeout_ms=20000, **sec.plain("bob"))
    got = []
    for m in c:     # stops at the last record, not after consumer_timeout_ms of silence
        got.append(m)
        if m.offset == end - 1:
            break
    assert len(got) >= 3 and [m.value for m in got[-3:]] == [b"m0", b"m1", b"m2"]
    c.commit()
    c.close()
    assert sec.committed("bob-group", "paid") == end
    # a group bob may not use: the commit is refused and nothing is stored
    c = KafkaConsumer(group_id="other-group", enable_auto_commit=False, **sec.plain("bob"))
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata
    with pytest.raises(KPError) as denied:
        c.commit({TopicPartition("paid", 0): OffsetAndMetadata(1, "", -1)})
    assert "GroupAuthorizationFailed" in type(denied.value).__name__
    c.close()
    assert sec.committed("other-group", "paid") < 0
    # a topic bob may see (Describe) but not read: the fetch is refused with TOPIC_AUTHORIZATION_FAILED
    sec.admin().create_topics([NewTopic("seen-not-read", 1)])["seen-not-read"].result(30)
    p = KafkaProducer(**sec.plain("admin"))
    p.send("seen-not-read", b"hidden").get(timeout=30)
    p.close()
    sec.acl("--allow", "User:bob", "--operation", "describe", "--topic", "seen-not-read")
    c = ck.Consumer(sec.scram("bob", **{"group.id": "bob-group", "enable.auto.commit": False}))
    c.assign([ck.TopicPartition("seen-not-read", 0, 0)])

    def refused():
        msg = c.poll(1)
        assert msg is None or msg.error() is not None, "bob read a record he may not read"
        return msg is not None and msg.error().code()
    try:
        assert wait.until(refused, "bob's fetch of secret is answered") == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        c.close()


def test_transactions_need_write_on_their_id(sec):
    sec.acl("--allow", "User:alice", "--operation", "write", "--transactional-id", "alice-tx")
    sec.acl("--allow", "User:alice", "--operation", "write", "--topic", "txn-out")
    before = sec.end_offset("txn-out")
    p = ck.Producer(sec.scram("alice", **{"transactional.id": "alice-tx"}))
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("txn-out", b"committed")
    p.commit_transaction(30)
    assert sec.end_offset("txn-out") == before + 2   # the record and the commit marker
    denied = ck.Producer(sec.scram("alice", **{"transactional.id": "bob-tx"}))
    with pytest.raises(ck.KafkaException) as exc:
        denied.init_transactions(30)
    assert exc.value.args[0].code() == ck.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert sec.end_offset("txn-out") == before + 2


def test_idempotent_producer_needs_idempotent_write_or_a_txn_id(sec):
    # bob: Write on the topic but nothing on the cluster or any transactional id
    sec.acl("--allow", "User:bob", "--operation", "write", "--topic", "bob-idem")
    sec.admin().create_topics([NewTopic("bob-idem", 1)])["bob-idem"].result(30)
    err = produce(sec.scram("bob", **{"enable.idempotence": True}), "bob-idem")
    assert err is not None and err.code() == ck.KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert sec.end_offset("bob-idem") == 0
    sec.acl("--allow", "User:bob", "--operation", "idempotent-write", "--cluster")
    assert produce(sec.scram("bob", **{"enable.idempotence": True}), "bob-idem") is None
    assert sec.end_offset("bob-idem") == 1


def test_deny_wins_over_allow(sec):
    sec.acl("--allow", "User:*", "--operation", "write", "--topic", "deny-", "--prefixed")
    sec.acl("--deny", "User:alice", "--operation", "write", "--topic", "deny-x")
    sec.admin().create_topics([NewTopic("deny-x", 1)])["deny-x"].result(30)
    err = produce(sec.scram("alice"), "deny-x")
    assert err is not None and err.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce(sec.scram("bob"), "deny-x") is None
    assert sec.end_offset("deny-x") == 1


def test_authorized_operations_are_the_principals_own(sec):
    """KIP-430: DescribeCluster, Metadata (describe_topics) and DescribeGroups, through
    confluent-kafka and kafka-python, answer exactly what dave's ACLs grant (Read
    implies Describe), and nothing when not asked."""
    add_user(sec.data_dir, "dave", "dave-pw")
    sec.admin().create_topics([NewTopic("ops-t", 1)])["ops-t"].result(30)
    for op, resource in (("read", ["--topic", "ops-t"]), ("describe-configs", ["--topic", "ops-t"]),
                         ("describe", ["--cluster"]), ("idempotent-write", ["--cluster"]),
                         ("read", ["--group", "ops-g"])):
        sec.acl("--allow", "User:dave", "--operation", op, *resource)
    dave = AdminClient(sec.scram("dave", password="dave-pw"))
    O = AclOperation
    assert set(dave.describe_cluster(include_authorized_operations=True).result(30).authorized_operations) \
        == {O.DESCRIBE, O.IDEMPOTENT_WRITE}
    assert dave.describe_cluster().result(30).authorized_operations is None
    (topic,) = dave.describe_topics(TopicCollection(["ops-t"]), include_authorized_operations=True).values()
    assert set(topic.result(30).authorized_operations) == {O.READ, O.DESCRIBE, O.DESCRIBE_CONFIGS}
    (group,) = dave.describe_consumer_groups(["ops-g"], include_authorized_operations=True).values()
    assert set(group.result(30).authorized_operations) == {O.READ, O.DESCRIBE}
    everything = sec.admin().describe_cluster(include_authorized_operations=True).result(30)
    assert set(everything.authorized_operations) == {O.CREATE, O.ALTER, O.DESCRIBE, O.CLUSTER_ACTION,
                                                     O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS, O.IDEMPOTENT_WRITE}
    kp = KafkaAdminClient(**sec.plain("dave", "dave-pw"))
    try:
        assert sorted(kp.describe_cluster()["authorized_operations"]) == ["DESCRIBE", "IDEMPOTENT_WRITE"]
        (described,) = kp.describe_topics(["ops-t"])
        assert sorted(described["authorized_operations"]) == ["DESCRIBE", "DESCRIBE_CONFIGS", "READ"]
        group = kp.describe_groups(["ops-g"])["ops-g"]
        assert sorted(group["authorized_operations"]) == ["DESCRIBE", "READ"]
    finally:
        kp.close()


def test_wrong_password_is_refused_logged_and_counted(sec):
    before = sec.metric("semel_failed_logins_total", mechanism="PLAIN")
    with pytest.raises(KPError):
        # kafka-python 3 bounds its bootstrap by bootstrap_timeout_ms (30 s by default),
        # not max_block_ms: set both so a refused login ends the call in seconds.
        KafkaProducer(**sec.plain("alice", password="wrong"), max_block_ms=5000, bootstrap_timeout_ms=5000)
    wait.until(lambda: sec.metric("semel_failed_logins_total", mechanism="PLAIN") > before,
               "the failed login is counted")
    log = sec.broker.log_path.read_text()
    assert "failed login" in log and "'alice'" in log and "wrong" not in log.split("failed login")[-1][:200]


def _sasl_handshake(sock, mechanism):
    return wire.call(sock, 17, 1, mechanism=mechanism)


def test_unknown_mechanism_gets_its_code_and_the_connection_closed(sec):
    sock = wire.connect(sec.broker.bootstrap)
    resp = _sasl_handshake(sock, "GSSAPI")
    assert resp.error_code == KafkaError.UNSUPPORTED_SASL_MECHANISM
    assert "SCRAM-SHA-512" in resp.mechanisms
    assert wire.closed_by_peer(sock)


def test_request_before_authentication_closes_the_connection(sec):
    sock = wire.connect(sec.broker.bootstrap)
    assert wire.call(sock, 18, 3, client_software_name="t", client_software_version="1").error_code == 0
    before = sec.end_offset("secret")
    assert wire.call(sock, 3, 1, topics=None) is None
    assert wire.closed_by_peer(sock)
    assert sec.end_offset("secret") == before


def test_scram_wrong_password_and_bad_token(sec):
    err = produce(sec.scram("alice", "SCRAM-SHA-512", password="nope", **{"message.timeout.ms": 3000}), "paid")
    assert err is not None
    sock = wire.connect(sec.broker.bootstrap)
    assert _sasl_handshake(sock, "SCRAM-SHA-256").error_code == 0
    resp = wire.call(sock, 36, 2, auth_bytes=b"\xff\xfe garbage")
    assert resp.error_code == KafkaError.SASL_AUTHENTICATION_FAILED
    assert wire.closed_by_peer(sock)


def test_users_change_without_restart(sec):
    assert produce(sec.scram("carol", password="carol-pw", **{"message.timeout.ms": 3000}), "paid") is not None
    add_user(sec.data_dir, "carol", "carol-pw")
    sec.acl("--allow", "User:carol", "--operation", "write", "--topic", "paid")
    assert produce(sec.scram("carol", password="carol-pw"), "paid") is None
    r = semel("user", "list", data_dir=sec.data_dir)
    assert "carol\tSCRAM-SHA-256,SCRAM-SHA-512" in r.stdout
    assert "carol-pw" not in (sec.data_dir / "__users.json").read_text()
    assert semel("user", "delete", "carol", data_dir=sec.data_dir).returncode == 0
    assert produce(sec.scram("carol", password="carol-pw", **{"message.timeout.ms": 3000}), "paid") is not None


@pytest.mark.parametrize("args, says", [
    (["--allow", "alice", "--topic", "t"], "principal must look like User:NAME"),
    (["--allow", "User:a", "--operation", "fly", "--topic", "t"], "unknown operation 'fly'"),
    (["--allow", "User:a", "--operation", "read", "--cluster"], "does not apply to CLUSTER"),
])
def test_malformed_acl_spec_is_one_line(sec, args, says):
    r = semel("acl", "add", *args, data_dir=sec.data_dir)
    assert r.returncode == 2
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_damaged_acl_file_keeps_the_last_good_acls(sec):
    path = sec.data_dir / "__acls.json"
    sec.acl("--allow", "User:alice", "--operation", "write", "--topic", "paid")
    good = path.read_text()
    assert produce(sec.scram("alice"), "paid") is None    # the broker has read this version
    try:
        path.write_text("[{not json")
        # failing open would allow everything, failing shut would refuse alice: neither
        assert produce(sec.scram("alice"), "paid") is None
        err = produce(sec.scram("alice"), "secret")
        assert err is not None and err.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
        r = semel("acl", "list", data_dir=sec.data_dir)
        assert r.returncode == 2 and "__acls.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    finally:
        path.write_text(good)
    assert "cannot be read; keeping the previous contents" in sec.broker.log_path.read_text()


def test_damaged_users_file_stops_the_start_in_one_line(tmp_path):
    (tmp_path / "__users.json").write_text('{"a": {"SCRAM-SHA-256": {}}}')
    r = semel("broker", "start", "--port", "0", "--security-protocol", "SASL_PLAINTEXT", data_dir=tmp_path)
    assert r.returncode == 2
    assert "__users.json" in r.stderr and r.stderr.count("semel broker:") == 1 and "Traceback" not in r.stderr


def test_cli_over_sasl_ssl(sec):
    base = ["group", "list", "--bootstrap", f"127.0.0.1:{sec.tls_port}", "--sasl-mechanism", "SCRAM-SHA-512",
            "--sasl-username", "admin"]
    r = semel(*base, "--ssl-cafile", str(sec.ca), env={"SEMEL_SASL_PASSWORD": PASSWORDS["admin"]})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "group\tstate\tprotocol-type\tgroup-type"
    r = semel(*base, "--sasl-password-env", "NOPE", "--ssl", env={"NOPE": "wrong"})   # system CAs: not ours
    assert r.returncode == 2 and "certificate was not accepted" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_users_over_the_admin_api_with_kafkas_errors(sec):
    """AlterUserScramCredentials / DescribeUserScramCredentials (KIP-554) with
    confluent-kafka's AdminClient on a single node: the user added logs in at once, its
    credential (from the salted password the client sent) is stored in the data dir's
    file, bad entries get Kafka's codes and change nothing, a non-super user is denied."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion,
                                       UserScramCredentialUpsertion)

    def upsert(name, iterations=4096, mechanism=ScramMechanism.SCRAM_SHA_256, password=b"frank-secret"):
        return UserScramCredentialUpsertion(name, ScramCredentialInfo(mechanism, iterations), password)

    def code(fut):
        try:
            fut.result(30)
        except KafkaException as exc:
            return exc.args[0].name()
        return "NO_ERROR"

    admin = sec.admin()
    futs = admin.alter_user_scram_credentials([upsert("frank"), upsert("few", iterations=100),
                                               upsert("many", iterations=20000)])
    assert {u: code(f) for u, f in futs.items()} == {"frank": "NO_ERROR", "few": "UNACCEPTABLE_CREDENTIAL",
                                                     "many": "UNACCEPTABLE_CREDENTIAL"}
    users = json.loads((sec.broker.data_dir / "__users.json").read_text())
    assert "few" not in users and "many" not in users and "frank-secret" not in json.dumps(users["frank"])
    p = ck.Producer(sec.scram("frank", password="frank-secret"))
    assert p.list_topics(timeout=30).brokers                        # logged in as frank
    missing = admin.alter_user_scram_credentials([UserScramCredentialDeletion("frank", ScramMechanism.SCRAM_SHA_512)])
    assert code(missing["frank"]) == "RESOURCE_NOT_FOUND"
    (info,) = admin.describe_user_scram_credentials(["frank"])["frank"].result(30).scram_credential_infos
    assert (info.mechanism, info.iterations) == (ScramMechanism.SCRAM_SHA_256, 4096)
    assert code(admin.describe_user_scram_credentials(["nobody"])["nobody"]) == "RESOURCE_NOT_FOUND"
    denied = sec.admin("alice").alter_user_scram_credentials([upsert("mallory")])
    assert code(denied["mallory"]) == "CLUSTER_AUTHORIZATION_FAILED"
    assert "mallory" not in json.loads((sec.broker.data_dir / "__users.json").read_text())
    gone = admin.alter_user_scram_credentials([UserScramCredentialDeletion("frank", ScramMechanism.SCRAM_SHA_256)])
    assert code(gone["frank"]) == "NO_ERROR"
    assert "frank" not in json.loads((sec.broker.data_dir / "__users.json").read_text())

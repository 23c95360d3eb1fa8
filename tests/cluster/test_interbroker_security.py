"""Inter-broker traffic when authentication is on.

One local cluster for the module: etcd and three broker processes whose client
listener (--host/--port) is SASL_SSL and whose brokers talk to each other only on a
second SASL_SSL listener named INTERNAL (Kafka's inter.broker.listener.name), each
verifying the others' certificates against a throwaway CA and logging in with
SCRAM-SHA-512 as the super user `broker`. Broker 0 also has a PLAINTEXT listener,
where anyone is User:ANONYMOUS.

- replication (min.insync.replicas 3, acks=all) and a transaction whose partitions are
  led by all three brokers (markers travel in WriteTxnMarkers between brokers) work;
- a principal that is not a broker (alice, who may read and write the topics, or
  ANONYMOUS) faking a follower's Fetch or the coordinator's WriteTxnMarkers gets
  CLUSTER_AUTHORIZATION_FAILED and nothing is served or written (read back as the
  super user `admin`); one that never logged in is disconnected; OffsetForLeaderEpoch
  takes ClusterAction (carol, by an ACL) or Describe on the topic (alice); the brokers'
  logins on INTERNAL last 1.5 s (KIP-368) and are renewed on their connections, never
  left to expire;
- a broker that lacks a credential refuses to start, in one line.
"""
from __future__ import annotations

import ssl
from functools import partial

import pytest
from confluent_kafka import Producer

from semel.broker.auth.cluster_store import save_users
from semel.broker.config import BrokerConfig
from semel.cli.main import main as semel_main
from semel.client.client import Client, ClientError
from semel.client.sasl import authenticate
from semel.cluster.peer import PeerDialer
from semel.cluster.state import BrokerInfo
from semel.launch.local_cluster import LocalCluster
from semel.launch.process import free_port
from semel.protocol.errors import KafkaError
from semel.protocol.messages import request_class
from semel.testing.certs import make_certs
from tests.support.cluster import partitions, wait_brokers
from tests.support.consume import read_values
from tests.support.markers import starts_processes
from tests.support.txn import call
from tests.support.wait import until

E = KafkaError
PASSWORDS = {"broker": "broker-secret", "admin": "admin-secret", "alice": "alice-secret", "carol": "carol-secret"}
PARTS = 3
# Logins on the brokers' listener last this long (KIP-368): their connections must log in again.
REAUTH_MS = 1500


class Secured:
    """The cluster and how each principal reaches it."""

    def __init__(self, cluster: LocalCluster, ca, plain_port: int):
        self.cluster, self.ca, self.plain_port = cluster, ca, plain_port

    def client(self, bootstrap: str, user: str | None = "admin", client_id: str = "semel-test") -> Client:
        """A semel Client over TLS, logged in as `user` (None: not logged in)."""
        c = Client(bootstrap, client_id=client_id, timeout_s=10,
                   ssl_context=ssl.create_default_context(cafile=str(self.ca)))
        if user is not None:
            authenticate(c, "SCRAM-SHA-512", user, PASSWORDS[user])
        return c

    def anonymous(self, client_id: str = "semel-test") -> Client:
        """Broker 0's PLAINTEXT listener: User:ANONYMOUS."""
        return Client(f"127.0.0.1:{self.plain_port}", client_id=client_id, timeout_s=10)

    def leader_bootstrap(self, topic: str, partition: int) -> str:
        leader = partitions(self.cluster, topic)[partition][0]
        return self.cluster.brokers[leader].bootstrap

    def kafka(self, user: str = "admin", **extra) -> dict:
        """confluent-kafka settings: SASL/SCRAM over TLS on the client listeners."""
        return {"bootstrap.servers": self.cluster.bootstrap, "security.protocol": "SASL_SSL",
                "ssl.ca.location": str(self.ca), "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
                "sasl.password": PASSWORDS[user], **extra}

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(high watermark, last stable offset) as the partition's leader answers the super user."""
        with self.client(self.leader_bootstrap(topic, partition)) as c:
            return c.list_offset(topic, partition, -1, 0), c.list_offset(topic, partition, -1, 1)


@pytest.fixture(scope="module")
@starts_processes
def secured(tmp_path_factory):
    d = tmp_path_factory.mktemp("interbroker")
    ca, cert, key = make_certs(d)
    args = ["--security-protocol", "SASL_SSL", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key),
            "--ssl-cafile", str(ca), "--listener", "INTERNAL://127.0.0.1:0", "--listener-protocol",
            "INTERNAL=SASL_SSL", "--listener-reauth-ms", f"INTERNAL={REAUTH_MS}",
            "--inter-broker-listener", "INTERNAL", "--inter-broker-sasl-mechanism",
            "SCRAM-SHA-512", "--inter-broker-user", "broker", "--inter-broker-password-env", "SEMEL_IB_PASSWORD",
            "--super-user", "User:broker", "--super-user", "User:admin", "--group-initial-rebalance-delay-ms", "0"]
    cluster = LocalCluster(d / "cluster", 3, lease_ttl_s=2, broker_args=args,
                           env={"SEMEL_IB_PASSWORD": PASSWORDS["broker"]},
                           prepare=partial(save_users, users=PASSWORDS))
    plain_port = free_port()
    cluster.brokers[0].extra_args += ["--listener", f"PLAINTEXT://127.0.0.1:{plain_port}"]
    s = Secured(cluster, ca, plain_port)
    cluster.connect = partial(s.client, user="admin")
    try:
        cluster.etcd.start()
        # In etcd, for every broker: alice may do anything with the ib- topics and nothing
        # on the cluster; carol the reverse.
        assert semel_main(["acl", "add", "--metadata", cluster.etcd.bootstrap, "--allow", "User:alice",
                           "--operation", "all", "--topic", "ib-", "--prefixed"]) == 0
        assert semel_main(["acl", "add", "--metadata", cluster.etcd.bootstrap, "--allow", "User:carol",
                           "--operation", "cluster-action", "--cluster"]) == 0
        cluster.start()
        wait_brokers(cluster, {0, 1, 2})
        yield s
    finally:
        cluster.stop()
        cluster.close()
    logs = [b.log_path.read_text(errors="replace") for b in cluster.brokers]
    for log in logs:   # the dialer logs every refusal, the brokers every session left to expire: none
        assert "cannot use broker" not in log and "without a re-authentication" not in log, log[-3000:]
    assert any("re-authenticated as User:broker" in log for log in logs)


def create(s: Secured, topic: str) -> None:
    """RF3, min.insync.replicas 3 (acks=all then needs both followers), leaders on all brokers."""
    with s.client(s.cluster.brokers[0].bootstrap) as c:
        assert c.create_topic(topic, PARTS, {"min.insync.replicas": "3"}, replication_factor=3) == E.NONE
    until(lambda: all(len(isr) == 3 for *_, isr in partitions(s.cluster, topic).values()),
          f"{topic}: leaders and full ISRs")
    assert {leader for leader, *_ in partitions(s.cluster, topic).values()} == {0, 1, 2}


def led_by(s: Secured, topic: str, node: int) -> int:
    return next(p for p, (leader, *_) in partitions(s.cluster, topic).items() if leader == node)


def fetch(c: Client, topic: str, partition: int, replica_id: int):
    T = request_class(1).FetchTopic
    return call(c, 1, 12, replica_id=replica_id, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                topics=[T(topic=topic, partitions=[T.FetchPartition(
                    partition=partition, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                    log_start_offset=-1, partition_max_bytes=1 << 20)])])


def epoch_end(c: Client, topic: str, partition: int, replica_id: int):
    """OffsetForLeaderEpoch v4 for epoch 0 as a follower asks it; (error, end offset)."""
    T = request_class(23).OffsetForLeaderTopic
    r = call(c, 23, 4, replica_id=replica_id, topics=[T(topic=topic, partitions=[T.OffsetForLeaderPartition(
        partition=partition, current_leader_epoch=-1, leader_epoch=0)])])
    (p,) = r.topics[0].partitions
    return E(p.error_code), p.end_offset


def write_marker(c: Client, topic: str, partition: int, pid: int, epoch: int, commit: bool = True):
    """WriteTxnMarkers v1 as the coordinator sends it; the per-partition error codes."""
    M = request_class(27).WritableTxnMarker
    r = call(c, 27, 1, markers=[M(producer_id=pid, producer_epoch=epoch, transaction_result=commit,
                                  coordinator_epoch=1 << 20, topics=[M.WritableTxnMarkerTopic(
                                      name=topic, partition_indexes=[partition])])])
    return [E(p.error_code) for m in r.markers for t in m.topics for p in t.partitions]


def open_transaction(s: Secured, topic: str, partition: int, txn_id: str) -> tuple[Producer, int, int]:
    """A confluent-kafka transaction left open with 3 records in `partition`: (producer, id, epoch)."""
    p = Producer(s.kafka(**{"transactional.id": txn_id}))
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, value=f"open-{i}".encode(), partition=partition)
    assert p.flush(30) == 0
    Q = request_class(61).TopicRequest
    with s.client(s.leader_bootstrap(topic, partition)) as c:
        r = c.request(61, topics=[Q(name=topic, partition_indexes=[partition])])
    (state,) = r.topics[0].partitions[0].active_producers
    assert state.current_txn_start_offset >= 0
    return p, state.producer_id, state.producer_epoch


# --- authenticated brokers: the cluster works ------------------------------------------

def test_replication_with_scram_over_tls(secured):
    s = secured
    create(s, "ib-repl")
    p = Producer(s.kafka("alice", acks="all", **{"enable.idempotence": False}))
    failed = []
    for i in range(300):
        p.produce("ib-repl", value=f"r{i:03d}".encode(), partition=i % PARTS,
                  on_delivery=lambda err, _m: err and failed.append(err))
    assert p.flush(60) == 0
    assert failed == []   # each acknowledgement needed both followers' fetches (min ISR 3)
    assert all(len(isr) == 3 for *_, isr in partitions(s.cluster, "ib-repl").values())
    got = read_values(s.cluster.bootstrap, "ib-repl", PARTS, "read_uncommitted", want=300, config=s.kafka("alice"))
    assert sorted(got) == [f"r{i:03d}" for i in range(300)]


def test_transaction_across_brokers_with_authentication(secured):
    s = secured
    create(s, "ib-txn")
    p = Producer(s.kafka(**{"transactional.id": "ib-txn-1"}))
    p.init_transactions(30)
    for n, commit in enumerate((True, False, True)):
        p.begin_transaction()
        for part in range(PARTS):   # one partition on each broker: markers to two other brokers
            p.produce("ib-txn", value=f"t{n}-{part}".encode(), partition=part)
        (p.commit_transaction if commit else p.abort_transaction)(30)
    want = sorted(f"t{n}-{part}" for n in (0, 2) for part in range(PARTS))
    assert sorted(read_values(s.cluster.bootstrap, "ib-txn", PARTS, want=len(want), config=s.kafka())) == want
    for part in range(PARTS):   # every marker written on its leader: nothing left open
        until(lambda part=part: (lambda hw, lso: hw == lso)(*s.offsets("ib-txn", part)),
              f"ib-txn-{part}: LSO reaches the high watermark")


# --- principals that are not brokers ----------------------------------------------------

def test_replica_fetch_needs_cluster_action(secured):
    s = secured
    create(s, "ib-fetch")
    part = led_by(s, "ib-fetch", 0)
    p = Producer(s.kafka(acks="all"))
    for i in range(10):
        p.produce("ib-fetch", value=f"f{i}".encode(), partition=part)
    assert p.flush(30) == 0
    before = (s.offsets("ib-fetch", part), partitions(s.cluster, "ib-fetch")[part])
    leader = s.cluster.brokers[0].bootstrap
    with s.client(leader, "alice") as c:
        as_consumer = fetch(c, "ib-fetch", part, -1)   # alice may read the topic...
        (r,) = as_consumer.responses[0].partitions
        assert r.error_code == 0 and r.records
        denied = fetch(c, "ib-fetch", part, 1)         # ...but not pose as follower 1
    with s.anonymous() as c:
        anonymous = fetch(c, "ib-fetch", part, 2)
    for resp in (denied, anonymous):
        assert resp.error_code == E.CLUSTER_AUTHORIZATION_FAILED
        (r,) = resp.responses[0].partitions
        assert r.error_code == E.TOPIC_AUTHORIZATION_FAILED and not r.records
    # Nothing recorded as a follower's progress: same high watermark, LSO, ISR and epoch.
    assert (s.offsets("ib-fetch", part), partitions(s.cluster, "ib-fetch")[part]) == before


def test_offset_for_leader_epoch_needs_cluster_action_or_describe(secured):
    s = secured
    create(s, "ib-epochs")
    part = led_by(s, "ib-epochs", 0)
    hw, _ = s.offsets("ib-epochs", part)
    for user in ("carol", "alice"):   # ClusterAction granted by an ACL; Describe on the topic (KIP-320)
        with s.client(s.cluster.brokers[0].bootstrap, user) as c:
            assert epoch_end(c, "ib-epochs", part, 1) == (E.NONE, hw), user
    with s.anonymous() as c:                                  # neither
        assert epoch_end(c, "ib-epochs", part, 2)[0] == E.TOPIC_AUTHORIZATION_FAILED


def test_metadata_answers_with_the_listener_asked_on(secured):
    s = secured
    main = {n: b.port for n, b in enumerate(s.cluster.brokers)}
    with s.client(s.cluster.brokers[1].bootstrap) as c:
        assert {b.node_id: b.port for b in c.metadata([]).brokers} == main
    with s.anonymous() as c:   # only broker 0 has a PLAINTEXT listener: the others answer with their main one
        assert {b.node_id: b.port for b in c.metadata([]).brokers} == {**main, 0: s.plain_port}


def test_fetch_before_login_closes_the_connection(secured):
    s = secured
    with s.client(s.cluster.brokers[0].bootstrap, user=None) as c:
        with pytest.raises(ClientError, match="closed the connection"):
            fetch(c, "ib-repl", 0, 1)


def test_write_txn_markers_needs_cluster_action(secured):
    s = secured
    create(s, "ib-markers")
    part = led_by(s, "ib-markers", 0)
    producer, pid, epoch = open_transaction(s, "ib-markers", part, "ib-markers-1")
    hw, lso = before = s.offsets("ib-markers", part)
    assert lso < hw   # the open transaction holds the LSO
    leader = s.cluster.brokers[0].bootstrap
    coordinator_id = "semel-txn-coordinator-1"   # posing as broker 1's coordinator, too
    with s.client(leader, "alice", client_id=coordinator_id) as c:
        assert write_marker(c, "ib-markers", part, pid, epoch) == [E.CLUSTER_AUTHORIZATION_FAILED]
    with s.anonymous(client_id=coordinator_id) as c:
        assert write_marker(c, "ib-markers", part, pid, epoch) == [E.CLUSTER_AUTHORIZATION_FAILED]
    assert s.offsets("ib-markers", part) == before   # no marker: same log end, the LSO still held
    assert read_values(s.cluster.bootstrap, "ib-markers", PARTS, config=s.kafka(), idle_s=1) == []
    producer.commit_transaction(30)   # the real coordinator's marker goes through
    until(lambda: s.offsets("ib-markers", part) == (hw + 1, hw + 1), "the commit marker written")
    got = read_values(s.cluster.bootstrap, "ib-markers", PARTS, want=3, config=s.kafka())
    assert sorted(got) == ["open-0", "open-1", "open-2"]


# --- configuration --------------------------------------------------------------------

def broker_start(tmp_path, *args: str) -> int:
    return semel_main(["broker", "start", "--data-dir", str(tmp_path / "d"), "--metadata", "127.0.0.1:1", *args])


@pytest.mark.parametrize("args, env, message", [
    (["--security-protocol", "SASL_PLAINTEXT"], {},
     "the inter-broker listener DEFAULT is SASL_PLAINTEXT: brokers need a login (--inter-broker-user"),
    (["--security-protocol", "SASL_PLAINTEXT", "--inter-broker-user", "b", "--inter-broker-password-env", "IB_UNSET"],
     {}, "--inter-broker-password-env: $IB_UNSET is not set"),
    (["--inter-broker-password-env", "IB_PW"], {"IB_PW": "x"}, "an inter-broker password needs --inter-broker-user"),
    (["--security-protocol", "SASL_SSL", "--ssl-certfile", "c.pem", "--ssl-keyfile", "c.key",
      "--inter-broker-user", "b", "--inter-broker-password-env", "IB_PW"], {"IB_PW": "x"},
     "brokers need --ssl-cafile"),
    (["--inter-broker-listener", "INTERNAL"], {}, "inter-broker listener 'INTERNAL' is none of this broker's"),
    (["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanisms", "PLAIN", "--inter-broker-sasl-mechanism",
      "SCRAM-SHA-256", "--inter-broker-user", "b", "--inter-broker-password-env", "IB_PW"], {"IB_PW": "x"},
     "inter-broker SASL mechanism SCRAM-SHA-256 is not enabled"),
])
def test_missing_inter_broker_settings_are_one_line_errors(tmp_path, capsys, monkeypatch, args, env, message):
    monkeypatch.delenv("IB_UNSET", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert broker_start(tmp_path, *args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_cluster_start_wants_the_password_with_the_user(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("IB_UNSET", raising=False)
    assert semel_main(["cluster", "start", "--data-dir", str(tmp_path), "--inter-broker-user", "b"]) == 2
    assert "--inter-broker-user and --inter-broker-password-env go together" in capsys.readouterr().err
    assert semel_main(["cluster", "start", "--data-dir", str(tmp_path), "--inter-broker-user", "b",
                       "--inter-broker-password-env", "IB_UNSET"]) == 2
    assert "$IB_UNSET is not set" in capsys.readouterr().err


def test_cluster_start_passes_the_login_on(monkeypatch):
    from types import SimpleNamespace

    from semel.cli.cluster import _inter_broker
    monkeypatch.setenv("IB_PW", "secret")
    flags, users = _inter_broker(SimpleNamespace(inter_broker_user="broker", inter_broker_password_env="IB_PW"))
    assert flags == ["--inter-broker-user", "broker", "--inter-broker-password-env", "IB_PW",
                     "--super-user", "User:broker"]
    assert users == {"broker": "secret"}
    assert _inter_broker(SimpleNamespace(inter_broker_user=None, inter_broker_password_env=None)) == ([], {})


def test_dialer_from_config(tmp_path):
    ca, cert, key = make_certs(tmp_path)
    cfg = BrokerConfig(data_dir=tmp_path, security_protocol="SASL_SSL", ssl_certfile=str(cert),
                       ssl_keyfile=str(key), ssl_cafile=str(ca), inter_broker_user="broker",
                       inter_broker_password="pw", listeners=["INTERNAL://0.0.0.0:9999"],
                       listener_security_protocol_map={"INTERNAL": "SASL_PLAINTEXT"})
    d = PeerDialer.from_config(cfg)   # the main listener: TLS and the strongest mechanism
    assert (d.listener, d.mechanism, d.principal) == ("DEFAULT", "SCRAM-SHA-512", "User:broker")
    assert d.ssl_context is not None and d.ssl_context.check_hostname
    assert "pw" not in repr(d) and "pw" not in repr(cfg)
    cfg.inter_broker_listener_name, cfg.inter_broker_sasl_mechanism = "INTERNAL", "plain"
    d = PeerDialer.from_config(cfg)   # a SASL listener without TLS
    assert (d.listener, d.mechanism, d.ssl_context) == ("INTERNAL", "PLAIN", None)
    plain = PeerDialer.from_config(BrokerConfig(data_dir=tmp_path))
    assert (plain.listener, plain.mechanism, plain.ssl_context, plain.principal) == ("DEFAULT", None, None, None)


# --- TLS between brokers, against one mTLS broker -------------------------------------------

@pytest.fixture(scope="module")
@starts_processes
def mtls(tmp_path_factory):
    """A broker whose SSL listener wants a client certificate from the test CA."""
    from tests.support.brokers import module_broker
    d = tmp_path_factory.mktemp("interbroker-mtls")
    ca, cert, key = make_certs(d)
    with module_broker(tmp_path_factory, "interbroker-mtls-broker", "--security-protocol", "SSL",
                       "--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--ssl-client-auth", "required",
                       "--ssl-cafile", str(ca)) as b:
        yield b, d


def _dial(dialer: PeerDialer, host: str, port: int):
    """ApiVersions over a dialed connection: its error code, or the exception the dial raised."""
    import asyncio

    async def go():
        conn = await dialer.connect(BrokerInfo(0, host, port), "semel-replica-1")
        try:
            return (await conn.call(18, 0, 10)).error_code
        finally:
            conn.close()
    try:
        return asyncio.run(go())
    except Exception as exc:   # what the caller (a fetcher, the marker channel) would see
        return exc


def test_tls_to_a_peer_checks_its_certificate_and_presents_ours(mtls, tmp_path):
    from semel.cluster.peer import PeerAuthError
    from semel.testing.certs import make_client_cert
    broker, d = mtls
    cert, key = make_client_cert(d, "broker-1", unit="brokers")

    def dialer(ca, certfile=None, keyfile=None) -> PeerDialer:
        return PeerDialer.from_config(BrokerConfig(data_dir=tmp_path, security_protocol="SSL", ssl_cafile=str(ca),
                                                   ssl_certfile=certfile, ssl_keyfile=keyfile))
    ok = dialer(d / "ca.pem", str(cert), str(key))
    assert _dial(ok, "127.0.0.1", broker.port) == 0          # its certificate checked, ours accepted
    # The peer's certificate names 127.0.0.1, not localhost: refused before any request.
    assert isinstance(_dial(ok, "localhost", broker.port), PeerAuthError)
    other = tmp_path / "other"
    other.mkdir()
    make_certs(other)                                        # a CA that did not sign the peer
    assert isinstance(_dial(dialer(other / "ca.pem", str(cert), str(key)), "127.0.0.1", broker.port), PeerAuthError)
    # Without a certificate of ours the peer ends the session (TLS 1.3: at the first read).
    refused = _dial(dialer(d / "ca.pem"), "127.0.0.1", broker.port)
    assert isinstance(refused, (OSError, EOFError)), refused


def test_broker_info_addresses():
    info = BrokerInfo(1, "10.0.0.1", 9092, endpoints=(("INTERNAL", "10.0.0.1", 9192),))
    assert info.address("DEFAULT") == ("10.0.0.1", 9092)
    assert info.address("INTERNAL") == ("10.0.0.1", 9192)
    assert info.address("OTHER") is None
    # A peer without the inter-broker listener is a configuration problem, not a network one.
    from semel.cluster.peer import PeerAuthError
    assert isinstance(_dial(PeerDialer(listener="OTHER"), "10.0.0.1", 9092), PeerAuthError)

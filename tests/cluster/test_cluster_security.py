"""Users and ACLs of a cluster live in etcd (semel.broker.auth.cluster_store): one set for every
broker, followed by each broker's watch, changed without a restart.

Real processes: etcd and three brokers with SASL_PLAINTEXT listeners (SCRAM and PLAIN,
logins re-authenticated under KIP-368), the brokers logging in to each other as the
super user `broker`.
- a user saved once (`semel user add --metadata`) logs in on every broker, and its
  salted credentials, never the password, are what etcd holds;
- an ACL created through broker 0 with confluent-kafka's AdminClient (CreateAcls)
  denies on brokers 1 and 2, and deleting it there (DeleteAcls through broker 2) lifts
  the denial on broker 0; DescribeAcls on any broker lists the same;
- deleting a user cuts its next re-authentication on every broker's open connection;
- users changed through one broker with the admin API (AlterUserScramCredentials)
  log in (or stop logging in) on all; DescribeUserScramCredentials lists them.
"""
from __future__ import annotations

import asyncio
from functools import partial

import pytest
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType)

from semel.broker.auth.cluster_store import EtcdSecurity, save_users
from semel.broker.config import BrokerConfig
from semel.cli.main import main as semel_main
from semel.client.client import Client, ClientError
from semel.client.sasl import authenticate
from semel.cluster.etcd import Etcd
from semel.launch.local_cluster import LocalCluster
from semel.protocol.errors import KafkaError
from tests.support.cluster import wait_brokers
from tests.support.markers import starts_processes
from tests.support.wait import until

PASSWORDS = {"broker": "broker-secret", "admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret",
             "carol": "carol-secret", "dave": "dave-secret"}
TOPIC = "cs-topic"


def login(bootstrap: str, user: str, mechanism: str = "SCRAM-SHA-512") -> Client:
    c = Client(bootstrap, timeout_s=10)
    try:
        authenticate(c, mechanism, user, PASSWORDS[user])
    except BaseException:
        c.close()
        raise
    return c


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    args = ["--security-protocol", "SASL_PLAINTEXT", "--connections-max-reauth-ms", "600000",
            "--inter-broker-user", "broker", "--inter-broker-password-env", "SEMEL_IB_PASSWORD",
            "--super-user", "User:broker", "--super-user", "User:admin"]
    c = LocalCluster(tmp_path_factory.mktemp("cluster-security"), 3, lease_ttl_s=2, broker_args=args,
                     env={"SEMEL_IB_PASSWORD": PASSWORDS["broker"]},
                     prepare=partial(save_users, users={"broker": PASSWORDS["broker"], "admin": PASSWORDS["admin"]}),
                     connect=partial(login, user="admin"))
    try:
        c.start()
        wait_brokers(c, {0, 1, 2})
        with login(c.brokers[0].bootstrap, "admin") as a:
            assert a.create_topic(TOPIC, 3, replication_factor=3) == KafkaError.NONE
        yield c
    finally:
        c.stop()
        c.close()


def user(cluster, action: str, name: str) -> int:
    return semel_main(["user", action, name, "--metadata", cluster.etcd.bootstrap,
                       *(["--password-env", "CS_PW"] if action == "add" else [])])


def logs_in(bootstrap: str, name: str, mechanism: str = "SCRAM-SHA-512") -> bool:
    try:
        login(bootstrap, name, mechanism).close()
        return True
    except ClientError:
        return False


def stored_users(cluster) -> dict:
    async def read():
        sec = EtcdSecurity(Etcd(cluster.etcd.bootstrap), BrokerConfig.cluster_id)
        try:
            return await sec.users()
        finally:
            await sec.etcd.close()
    return asyncio.run(read())


def test_a_user_saved_once_logs_in_on_every_broker(cluster, monkeypatch):
    assert not any(logs_in(b.bootstrap, "alice") for b in cluster.brokers)
    monkeypatch.setenv("CS_PW", PASSWORDS["alice"])
    assert user(cluster, "add", "alice") == 0
    for b in cluster.brokers:
        until(lambda b=b: logs_in(b.bootstrap, "alice"), f"alice logs in on {b.bootstrap}")
        assert logs_in(b.bootstrap, "alice", "PLAIN")           # PLAIN checks the same salted hash
    creds = stored_users(cluster)["alice"]
    assert sorted(creds) == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    assert PASSWORDS["alice"] not in repr(creds)


def _alice_sees_topic(bootstrap: str) -> int:
    """Metadata for the topic, as alice: 0, or TOPIC_AUTHORIZATION_FAILED when denied."""
    with login(bootstrap, "alice") as c:
        (t,) = c.metadata([TOPIC]).topics
        return t.error_code


def _acl(permission) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, "User:alice", "*",
                      AclOperation.DESCRIBE, permission)


def test_an_acl_created_through_one_broker_decides_on_all(cluster, monkeypatch):
    monkeypatch.setenv("CS_PW", PASSWORDS["alice"])
    assert user(cluster, "add", "alice") == 0
    admin_settings = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                      "sasl.username": "admin", "sasl.password": PASSWORDS["admin"]}
    a0 = AdminClient({"bootstrap.servers": cluster.brokers[0].bootstrap, **admin_settings})
    for b in cluster.brokers:   # no ACL on the topic: closed (allow.everyone.if.no.acl.found off)
        until(lambda b=b: logs_in(b.bootstrap, "alice"), "alice known everywhere")
        assert _alice_sees_topic(b.bootstrap) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    a0.create_acls([_acl(AclPermissionType.ALLOW)])[_acl(AclPermissionType.ALLOW)].result(30)
    for b in cluster.brokers:
        until(lambda b=b: _alice_sees_topic(b.bootstrap) == KafkaError.NONE, f"allowed on {b.bootstrap}")
    deny = _acl(AclPermissionType.DENY)
    a0.create_acls([deny])[deny].result(30)                       # through broker 0 ...
    for b in cluster.brokers[1:]:                                  # ... denies on 1 and 2
        until(lambda b=b: _alice_sees_topic(b.bootstrap) == KafkaError.TOPIC_AUTHORIZATION_FAILED,
              f"denied on {b.bootstrap}")
    a2 = AdminClient({"bootstrap.servers": cluster.brokers[2].bootstrap, **admin_settings})
    listed = a2.describe_acls(AclBindingFilter(ResourceType.TOPIC, TOPIC, ResourcePatternType.ANY, None, None,
                                               AclOperation.ANY, AclPermissionType.ANY)).result(30)
    assert sorted(b.permission_type.name for b in listed) == ["ALLOW", "DENY"]
    gone = a2.delete_acls([AclBindingFilter(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, "User:alice",
                                            "*", AclOperation.DESCRIBE, AclPermissionType.DENY)])
    assert [b.permission_type.name for b in list(gone.values())[0].result(30)] == ["DENY"]
    until(lambda: _alice_sees_topic(cluster.brokers[0].bootstrap) == KafkaError.NONE, "allowed again on broker 0")


def test_deleting_a_user_cuts_its_next_reauthentication_on_every_broker(cluster, monkeypatch):
    monkeypatch.setenv("CS_PW", PASSWORDS["bob"])
    assert user(cluster, "add", "bob") == 0
    for b in cluster.brokers:
        until(lambda b=b: logs_in(b.bootstrap, "bob"), "bob known everywhere")
    conns = [login(b.bootstrap, "bob") for b in cluster.brokers]
    try:
        for c in conns:   # a re-login works while bob exists (KIP-368: same mechanism and principal)
            authenticate(c, "SCRAM-SHA-512", "bob", PASSWORDS["bob"])
        assert user(cluster, "delete", "bob") == 0
        assert "bob" not in stored_users(cluster)
        for b in cluster.brokers:   # every broker has seen the deletion ...
            until(lambda b=b: not logs_in(b.bootstrap, "bob"), f"bob refused on {b.bootstrap}")
        for c in conns:             # ... and the open connections fail their next re-login
            with pytest.raises(ClientError, match="SASL_AUTHENTICATION_FAILED|authentication failed"):
                authenticate(c, "SCRAM-SHA-512", "bob", PASSWORDS["bob"])
            with pytest.raises((ClientError, OSError)):
                c.metadata([])      # closed by the broker after the failed re-login
    finally:
        for c in conns:
            c.close()
    assert user(cluster, "delete", "bob") != 0       # one line: no such user


def _admin(cluster, node: int, who: str = "admin") -> AdminClient:
    """confluent-kafka's AdminClient on broker `node` only (keep it while awaiting its futures)."""
    return AdminClient({"bootstrap.servers": cluster.brokers[node].bootstrap, "security.protocol": "SASL_PLAINTEXT",
                        "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": who, "sasl.password": PASSWORDS[who]})


def test_users_altered_through_one_broker_with_the_admin_api(cluster, monkeypatch):
    """AlterUserScramCredentials (KIP-554) through broker 1: the client sends a salted
    password; the user then logs in on brokers 0 and 2, DescribeUserScramCredentials on
    broker 2 lists its mechanism and iterations, and a deletion through broker 0 refuses
    it everywhere. A principal without Alter on the cluster changes nothing."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion,
                                       UserScramCredentialUpsertion)
    monkeypatch.setenv("CS_PW", PASSWORDS["alice"])
    assert user(cluster, "add", "alice") == 0
    carol = UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                         PASSWORDS["carol"].encode())
    until(lambda: logs_in(cluster.brokers[1].bootstrap, "alice"), "alice known on broker 1")
    as_alice = _admin(cluster, 1, "alice")
    with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
        as_alice.alter_user_scram_credentials([carol])["carol"].result(30)
    assert "carol" not in stored_users(cluster)

    a1 = _admin(cluster, 1)
    a1.alter_user_scram_credentials([carol])["carol"].result(30)
    for b in cluster.brokers:
        until(lambda b=b: logs_in(b.bootstrap, "carol"), f"carol logs in on {b.bootstrap}")
    assert not logs_in(cluster.brokers[0].bootstrap, "carol", "SCRAM-SHA-256")   # only the mechanism set
    a2 = _admin(cluster, 2)
    (info,) = a2.describe_user_scram_credentials(["carol"])["carol"].result(30).scram_credential_infos
    assert (info.mechanism, info.iterations) == (ScramMechanism.SCRAM_SHA_512, 8192)

    a0 = _admin(cluster, 0)
    a0.alter_user_scram_credentials([UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_512)])[
        "carol"].result(30)
    for b in cluster.brokers:
        until(lambda b=b: not logs_in(b.bootstrap, "carol"), f"carol refused on {b.bootstrap}")
    with pytest.raises(KafkaException, match="RESOURCE_NOT_FOUND"):
        a0.describe_user_scram_credentials(["carol"])["carol"].result(30)


def test_authorized_operations_on_every_broker(cluster, monkeypatch):
    """KIP-430 in a cluster: ACLs created through broker 0 (in etcd) decide what
    DescribeCluster and Metadata report as dave's operations on every broker."""
    from confluent_kafka import TopicCollection
    monkeypatch.setenv("CS_PW", PASSWORDS["dave"])
    assert user(cluster, "add", "dave") == 0
    grants = [AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:dave", "*",
                         AclOperation.DESCRIBE, AclPermissionType.ALLOW),
              AclBinding(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, "User:dave", "*",
                         AclOperation.WRITE, AclPermissionType.ALLOW)]
    a0 = _admin(cluster, 0)
    for f in a0.create_acls(grants).values():
        f.result(30)
    for node, b in enumerate(cluster.brokers):
        until(lambda b=b: logs_in(b.bootstrap, "dave"), f"dave known on {b.bootstrap}")
        dave = _admin(cluster, node, "dave")

        def operations(dave=dave):
            described = dave.describe_cluster(include_authorized_operations=True).result(30)
            (topic,) = dave.describe_topics(TopicCollection([TOPIC]), include_authorized_operations=True).values()
            return (set(described.authorized_operations or ()),
                    set(topic.result(30).authorized_operations or ()))
        until(lambda: operations() == ({AclOperation.DESCRIBE}, {AclOperation.WRITE, AclOperation.DESCRIBE}),
              f"dave's operations on broker {node}")

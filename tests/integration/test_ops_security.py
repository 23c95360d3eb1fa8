"""Authorization of the operations APIs, allowed and denied, with kafka-python's
admin client over SASL/PLAIN against a real broker (super user User:admin,
ACLs added with `semel acl` while it runs):

- ListTransactions lists only the transactional ids the caller may describe;
- DescribeTransactions needs Describe on the transactional id;
- DescribeProducers needs Read on the topic;
- WriteTxnMarkers (the admin abort) needs ClusterAction: denied, nothing is written;
- DeleteGroups needs Delete on the group: denied, the group and its offsets stay.
Each denied case is read back as the super user."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import kafka.errors as KE
import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.admin._transactions import AbortTransactionSpec
from kafka.structs import OffsetAndMetadata, TopicPartition

from support.brokers import module_broker
from support.console import console_process, get
from support.wait import until

PASSWORDS = {"admin": "admin-pw", "alice": "alice-pw"}
TOPIC, TP = "ops", TopicPartition("ops", 0)


def semel(*args, env=None):
    r = subprocess.run([sys.executable, "-m", "semel", *args], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, **(env or {})))
    assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    with module_broker(tmp_path_factory, "ops-security", "--security-protocol", "SASL_PLAINTEXT",
                       "--super-user", "User:admin") as b:
        for name, pw in PASSWORDS.items():   # users change without a restart
            semel("user", "add", name, "--password-env", "SEMEL_PW", "--data-dir", str(b.data_dir),
                  env={"SEMEL_PW": pw})
        yield b


def sasl(b, user: str) -> dict:
    return dict(bootstrap_servers=b.bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                sasl_plain_username=user, sasl_plain_password=PASSWORDS[user])


def acl(b, *args: str) -> None:
    semel("acl", "add", "--data-dir", str(b.data_dir), "--allow", "User:alice", *args)


def open_txn(b, txn_id: str) -> KafkaProducer:
    p = KafkaProducer(transactional_id=txn_id, **sasl(b, "admin"))
    p.init_transactions()
    p.begin_transaction()
    p.send(TOPIC, b"undecided", partition=0).get(30)
    return p


def open_producers(admin: KafkaAdminClient) -> list[int]:
    return sorted(p.producer_id for p in admin.describe_producers([TP])[TP].active_producers
                  if p.current_transaction_start_offset >= 0)


def test_transaction_admin_allowed_and_denied(secured, tmp_path):
    b = secured
    root = KafkaAdminClient(**sasl(b, "admin"))
    root.create_topics([NewTopic(TOPIC, 1, 1)])
    producers = [open_txn(b, "ops-open"), open_txn(b, "hidden-open")]
    acl(b, "--operation", "describe", "--transactional-id", "ops-open")
    acl(b, "--operation", "describe", "--topic", TOPIC)
    alice = KafkaAdminClient(**sasl(b, "alice"))
    try:
        seen = {t.transactional_id for ts in alice.list_transactions().values() for t in ts}
        assert seen == {"ops-open"}
        assert {"ops-open", "hidden-open"} <= {t.transactional_id for ts in root.list_transactions().values()
                                                for t in ts}
        assert alice.describe_transactions(["ops-open"])["ops-open"].state.value == "Ongoing"
        with pytest.raises(KE.TransactionalIdAuthorizationFailedError):
            alice.describe_transactions(["hidden-open"])

        with pytest.raises(KE.TopicAuthorizationFailedError):
            alice.describe_producers([TP])
        acl(b, "--operation", "read", "--topic", TOPIC)
        assert len(open_producers(alice)) == 2
    finally:
        alice.close()
        for p in producers:
            p.close(timeout=5)

    # Lose the coordinator's state: hidden-open's data now hangs in ops-0.
    hidden = root.describe_transactions(["hidden-open"])["hidden-open"].producer_id
    root.close()
    b.stop()
    shutil.rmtree(b.data_dir / "__transaction_state-0")
    b.start()
    root, alice = KafkaAdminClient(**sasl(b, "admin")), KafkaAdminClient(**sasl(b, "alice"))
    try:
        state = next(p for p in root.describe_producers([TP])[TP].active_producers if p.producer_id == hidden)
        spec = AbortTransactionSpec(TP, hidden, state.producer_epoch, state.coordinator_epoch)
        with pytest.raises(KE.ClusterAuthorizationFailedError):
            alice.abort_transaction(spec)
        assert hidden in open_producers(root)          # nothing was written
        root.abort_transaction(spec)                   # the super user may
        assert hidden not in open_producers(root)
    finally:
        root.close()
        alice.close()


def test_delete_groups_allowed_and_denied(secured):
    b = secured
    root = KafkaAdminClient(**sasl(b, "admin"))
    try:
        if TOPIC not in root.list_topics():
            root.create_topics([NewTopic(TOPIC, 1, 1)])
        c = KafkaConsumer(group_id="g-ops", enable_auto_commit=False, **sasl(b, "admin"))
        c.assign([TP])
        c.commit({TP: OffsetAndMetadata(0, "", -1)})
        c.close()
        # Describe lets alice find the group's coordinator; Delete is what she lacks.
        acl(b, "--operation", "describe", "--group", "g-ops")
        alice = KafkaAdminClient(**sasl(b, "alice"))
        try:
            # (kafka-python names the error of each group: "OK" or the error class name)
            assert alice.delete_groups(["g-ops"]) == {"g-ops": "GroupAuthorizationFailedError"}
            assert root.list_group_offsets(["g-ops"])["g-ops"][TP].offset == 0   # still there
            acl(b, "--operation", "delete", "--group", "g-ops")
            assert alice.delete_groups(["g-ops"]) == {"g-ops": "OK"}
        finally:
            alice.close()
        assert "g-ops" not in {g[0] if isinstance(g, tuple) else g.group_id for g in root.list_groups()}
    finally:
        root.close()


def cli(b, user: str | None, *args: str, password: str | None = None, mechanism: str = "PLAIN"):
    login = [] if user is None else ["--sasl-mechanism", mechanism, "--sasl-username", user]
    env = dict(os.environ, SEMEL_SASL_PASSWORD=password or PASSWORDS.get(user or "", ""))
    return subprocess.run([sys.executable, "-m", "semel", *args, "--bootstrap", b.bootstrap, *login],
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_semel_txn_and_group_log_in_and_see_what_the_acls_allow(secured, mechanism):
    b = secured
    visible, hidden = f"cli-visible-{mechanism}", f"cli-hidden-{mechanism}"
    producers = [open_txn(b, visible), open_txn(b, hidden)]
    try:
        acl(b, "--operation", "describe", "--transactional-id", visible)
        as_admin = cli(b, "admin", "txn", "list", mechanism=mechanism)
        assert as_admin.returncode == 0, as_admin.stderr
        as_alice = cli(b, "alice", "txn", "list", mechanism=mechanism)
        assert as_alice.returncode == 0, as_alice.stderr
        admin_ids = {line.split("\t")[0] for line in as_admin.stdout.splitlines()[1:]}
        alice_ids = {line.split("\t")[0] for line in as_alice.stdout.splitlines()[1:]}
        assert {visible, hidden} <= admin_ids
        assert visible in alice_ids and hidden not in alice_ids   # only what she may describe
        r = cli(b, "alice", "txn", "describe", hidden, mechanism=mechanism)
        assert r.returncode == 2 and "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in r.stderr
        assert "state: Ongoing" in cli(b, "alice", "txn", "describe", visible, mechanism=mechanism).stdout
        assert cli(b, "admin", "group", "list", mechanism=mechanism).returncode == 0
    finally:
        for p in producers:
            p.close(timeout=5)
    r = cli(b, "alice", "txn", "list", password="wrong", mechanism=mechanism)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "SASL" in r.stderr
    r = cli(b, None, "txn", "list")   # no login on a SASL listener: the broker closes the connection
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_console_logs_in_and_says_in_words_what_its_user_may_not_read(secured, tmp_path):
    """`semel console` takes the same SASL options: as admin it shows an open transaction
    and its gap; as alice, who may describe the topic but not read it, the producer
    state is missing with the reason in words and the transaction is not listed."""
    b = secured
    root = KafkaAdminClient(**sasl(b, "admin"))
    root.create_topics([NewTopic("console-ops", 1, 1)])
    root.close()
    acl(b, "--operation", "describe", "--topic", "console-ops")
    p = KafkaProducer(transactional_id="console-open", **sasl(b, "admin"))
    p.init_transactions()
    p.begin_transaction()
    p.send("console-ops", b"undecided", partition=0).get(30)
    try:
        for user, seen in (("admin", True), ("alice", False)):
            with console_process(b.bootstrap, tmp_path / f"console-{user}.log", "--sasl-mechanism", "PLAIN",
                                 "--sasl-username", user, env={"SEMEL_SASL_PASSWORD": PASSWORDS[user]}) as url:
                topics = until(lambda: _page_with(url, "/topics", 'id="tp-console-ops-0"'),
                               f"the console as {user} lists console-ops")
                assert 'data-gap="1"' in topics
                if seen:
                    until(lambda: 'id="txn-console-open"' in get(url, "/transactions"), "the open transaction")
                else:
                    assert "the console&#39;s user may not read this topic" in topics, topics
                    assert "TOPIC_AUTHORIZATION_FAILED" in topics
                    assert "console-open" not in get(url, "/transactions")
    finally:
        p.abort_transaction()
        p.close(timeout=5)


def _page_with(url: str, path: str, text: str) -> str | None:
    page = get(url, path)
    return page if text in page else None

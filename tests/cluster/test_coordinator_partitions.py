"""Coordinators partitioned by id on a real local cluster (etcd and three broker
processes).

`__transaction_state` and `__consumer_offsets` have 6 partitions each (the default),
RF3, their leaders spread over the brokers. An id's coordinator is the leader of
partition abs(String.hashCode(id)) % 6:

- FindCoordinator (v3 one key, v4 several) names that leader from every broker, ids
  land on partitions led by all three brokers, and only that leader serves the id;
- two confluent-kafka consume-transform-produce copies whose transaction coordinators
  sit on different brokers: SIGKILLing one coordinator's broker moves that copy's
  coordinator (it still ends exactly once) while the other copy goes on committing
  without a single error;
- committed offsets of a group on each partition survive killing the broker that
  coordinates one of them, and ListGroups / ListTransactions over the brokers list
  every group and transactional id;
- `semel group` and `semel txn`, given one broker, reach every coordinator and every
  partition's leader.
"""
from __future__ import annotations

import threading

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from semel.client.client import Client
from semel.protocol.txn_hash import java_string_hash, partition_for
from semel.eos.kafka import RESTART_SAFE_CONFIG
from semel.protocol.errors import KafkaError
from tests.support.cluster import committed, fill, key_leader, module_cluster, partitions, wait_brokers
from tests.support.consume import read_values
from tests.support.consumer_protocol import semel_cli
from tests.support.copier import Copier
from tests.support.markers import starts_processes
from tests.support.txn import RawTxn, call
from tests.support.wait import in_background, until

TXN_TOPIC, OFFSETS_TOPIC = "__transaction_state", "__consumer_offsets"
COUNT, PARTS, N = 6, 3, 240


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "coord-partitions", 3, 2, "--group-initial-rebalance-delay-ms", "0",
                        "--min-insync-replicas", "2") as c:
        yield c


def test_java_string_hash_and_kafkas_partition_formula():
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("") == 0
    assert java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00          # UTF-16 code units
    assert java_string_hash("polygenelubricants") == -(1 << 31)             # Integer.MIN_VALUE
    assert partition_for("polygenelubricants", 6) == 0                      # Utils.abs(MIN_VALUE) = 0
    assert partition_for("hello", 50) == 99162322 % 50


def find(cluster, via: int, key_type: int, key: str) -> tuple[int, int]:
    with Client(cluster.brokers[via].bootstrap, timeout_s=10) as c:
        r = call(c, 10, 3, key=key, key_type=key_type)
    return r.error_code, r.node_id


def find_many(cluster, via: int, key_type: int, keys: list[str]) -> dict[str, tuple[int, int]]:
    with Client(cluster.brokers[via].bootstrap, timeout_s=10) as c:
        r = call(c, 10, 4, key_type=key_type, coordinator_keys=keys)
    return {x.key: (x.error_code, x.node_id) for x in r.coordinators}


def internal_ready(cluster) -> None:
    """Both internal topics created (by a FindCoordinator), every partition led and its ISR full."""
    for key_type, topic in ((1, TXN_TOPIC), (0, OFFSETS_TOPIC)):
        until(lambda k=key_type: find(cluster, 0, k, "any")[0] == 0, f"{topic} created")
        until(lambda t=topic: all(leader >= 0 and len(isr) == 3 for leader, _, _, isr in partitions(cluster, t).values()),
              f"{topic}: every partition led, full ISR", 90)


def settle(cluster) -> None:
    wait_brokers(cluster, {0, 1, 2})
    internal_ready(cluster)


def test_ids_land_on_partitions_led_by_every_broker(cluster):
    internal_ready(cluster)
    for topic in (TXN_TOPIC, OFFSETS_TOPIC):
        parts = partitions(cluster, topic)
        assert sorted(parts) == list(range(COUNT))
        assert all(len(replicas) == 3 for _, _, replicas, _ in parts.values())
        assert {leader for leader, *_ in parts.values()} == {0, 1, 2}      # leaders spread
    ids = [f"id-{i}" for i in range(24)]
    assert {partition_for(i, COUNT) for i in ids} == set(range(COUNT))
    for key_type, topic in ((1, TXN_TOPIC), (0, OFFSETS_TOPIC)):
        want = {i: (0, key_leader(cluster, topic, i)) for i in ids}
        assert set(want.values()) == {(0, 0), (0, 1), (0, 2)}
        for via in range(3):
            assert {i: find(cluster, via, key_type, i) for i in ids} == want
            assert find_many(cluster, via, key_type, ids) == want
    # Only the id's coordinator serves and describes it; the others send the client to look again.
    for txn_id in ids[:COUNT]:
        coordinator = key_leader(cluster, TXN_TOPIC, txn_id)
        for n in range(3):
            with Client(cluster.brokers[n].bootstrap, timeout_s=10) as c:
                got = RawTxn(c, txn_id).init()
                (described,) = call(c, 65, 0, transactional_ids=[txn_id]).transaction_states
            want = KafkaError.NONE if n == coordinator else KafkaError.NOT_COORDINATOR
            assert (got, described.error_code) == (want, want), (txn_id, n)


def create(cluster, topic: str, assignment=None) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    new = (NewTopic(topic, len(assignment), replica_assignment=assignment, config={"min.insync.replicas": "2"})
           if assignment else NewTopic(topic, PARTS, 3, config={"min.insync.replicas": "2"}))
    admin.create_topics([new])[topic].result(30)
    until(lambda: all(leader >= 0 for leader, *_ in partitions(cluster, topic).values()), f"{topic}: leaders")


def pick(candidates, ok) -> str:
    return next(c for c in candidates if ok(c))


def test_killing_one_coordinators_broker_leaves_the_other_copy_undisturbed(cluster):
    settle(cluster)
    victim = key_leader(cluster, TXN_TOPIC, "pa-moved")
    others = sorted({0, 1, 2} - {victim})
    # The undisturbed copy: transaction and group coordinators elsewhere, and its topics'
    # partitions led elsewhere too (the victim only follows them).
    steady = pick((f"pa-steady-{i}" for i in range(200)),
                  lambda t: key_leader(cluster, TXN_TOPIC, t) != victim
                  and key_leader(cluster, OFFSETS_TOPIC, f"g-{t}") != victim)
    away = [[others[p % 2], others[(p + 1) % 2], victim] for p in range(PARTS)]
    create(cluster, "pa-steady-in", away)
    create(cluster, "pa-steady-out", away)
    create(cluster, "pa-moved-in")
    create(cluster, "pa-moved-out")
    ends = {p: sum(1 for i in range(N) if i % PARTS == p) for p in range(PARTS)}
    values = {name: fill(cluster, f"{name}-in", N, PARTS) for name in ("pa-steady", "pa-moved")}
    moved = Copier(cluster, "pa-moved-in", "pa-moved-out", "pa-moved")
    kept = Copier(cluster, "pa-steady-in", "pa-steady-out", steady)
    started = threading.Event()
    kept_commits = []
    worker_moved, errors_moved = in_background(lambda: moved.run(ends, lambda n: None), started)
    worker_kept, errors_kept = in_background(lambda: kept.run(ends, kept_commits.append), started)
    until(lambda: moved.commits >= 2 and kept.commits >= 2, "both copies committing", 120)
    cluster.brokers[victim].kill()
    try:
        at_kill = kept.commits
        # The other copy commits on while the victim is down (its coordinators never moved).
        until(lambda: kept.commits >= at_kill + 3 or not worker_kept.is_alive(), "the other copy goes on", 120)
        until(lambda: (n := key_leader(cluster, TXN_TOPIC, "pa-moved")) not in (-1, victim) and (n,),
              "pa-moved's coordinator moved", 90)
    finally:
        cluster.brokers[victim].restart()
    worker_moved.join(300)
    worker_kept.join(300)
    assert not worker_moved.is_alive() and errors_moved == [], moved.failures
    assert not worker_kept.is_alive() and errors_kept == []
    assert kept.failures == [], "the copy whose coordinators stayed saw errors"
    settle(cluster)
    for name in ("pa-steady", "pa-moved"):
        assert sorted(read_values(cluster.bootstrap, f"{name}-out", PARTS, "read_committed", want=N)) \
            == values[name], (moved.failures, kept.failures)


def listed(cluster, api: int) -> set[str]:
    """ListGroups (16) or ListTransactions (66) asked of every broker, together."""
    out = set()
    for b in cluster.brokers:
        with Client(b.bootstrap, timeout_s=10) as c:
            if api == 16:
                r = call(c, 16, 4, states_filter=[])
                out |= {g.group_id for g in r.groups}
            else:
                r = call(c, 66, 0, state_filters=[], producer_id_filters=[])
                out |= {t.transactional_id for t in r.transaction_states}
            assert r.error_code == 0
    return out


def test_groups_on_several_partitions_keep_their_offsets_when_one_coordinator_dies(cluster):
    settle(cluster)
    create(cluster, "po-in")
    tps = [TopicPartition("po-in", p) for p in range(PARTS)]
    # One group per partition (leaders do not move back after the last test's restart,
    # so not every broker need lead one now).
    groups = [pick((f"po-{i}" for i in range(200)), lambda g, p=p: partition_for(g, COUNT) == p)
              for p in range(COUNT)]
    assert len({key_leader(cluster, OFFSETS_TOPIC, g) for g in groups}) >= 2
    want = {g: {p: 10 * k + p for p in range(PARTS)} for k, g in enumerate(groups)}
    for g in groups:
        c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": g, "enable.auto.commit": False,
                      **RESTART_SAFE_CONFIG})
        c.commit(offsets=[TopicPartition("po-in", p, o) for p, o in want[g].items()], asynchronous=False)
        c.close()
    assert set(groups) <= listed(cluster, 16)
    assert {"id-0", "id-1", "id-2"} <= listed(cluster, 66)      # initialised by the first test
    victim = key_leader(cluster, OFFSETS_TOPIC, groups[0])
    cluster.brokers[victim].kill()
    try:
        until(lambda: (n := key_leader(cluster, OFFSETS_TOPIC, groups[0])) not in (-1, victim) and (n,),
              "the group's coordinator moved", 90)
        for g in groups:
            assert committed(cluster, g, tps) == want[g]
    finally:
        cluster.brokers[victim].restart()
    settle(cluster)
    for g in groups:
        assert committed(cluster, g, tps) == want[g]
    assert set(groups) <= listed(cluster, 16)


def test_the_group_cli_given_one_broker_reaches_every_coordinator_and_leader(cluster):
    """`semel group` given broker 0 alone lists, describes, resets and deletes groups
    that other brokers coordinate, reading each partition's log end from its leader."""
    settle(cluster)
    create(cluster, "cli-in")
    fill(cluster, "cli-in", 5 * PARTS, PARTS)
    assert {leader for leader, *_ in partitions(cluster, "cli-in").values()} - {0}
    groups = [pick((f"cli-{i}" for i in range(200)), lambda g, p=p: partition_for(g, COUNT) == p)
              for p in range(COUNT)]
    assert {key_leader(cluster, OFFSETS_TOPIC, g) for g in groups} - {0}
    tps = [TopicPartition("cli-in", p) for p in range(PARTS)]
    for g in groups:
        c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": g, "enable.auto.commit": False,
                      **RESTART_SAFE_CONFIG})
        c.commit(offsets=[TopicPartition("cli-in", p, p + 1) for p in range(PARTS)], asynchronous=False)
        c.close()
    boot = ("--bootstrap", cluster.brokers[0].bootstrap)
    rows = [line.split("\t") for line in semel_cli("group", "list", *boot).splitlines()[1:]]
    assert set(groups) <= {r[0] for r in rows}
    for g in groups:
        described = semel_cli("group", "describe", g, *boot)
        for p in range(PARTS):   # committed, log end and lag, each end from the partition's leader
            assert f"cli-in\t{p}\t{p + 1}\t5\t{4 - p}" in described.splitlines(), described
    elsewhere = next(g for g in groups if key_leader(cluster, OFFSETS_TOPIC, g) != 0)
    semel_cli("group", "reset-offsets", elsewhere, "--topic", "cli-in", "--to-latest", "--execute", *boot)
    assert committed(cluster, elsewhere, tps) == {p: 5 for p in range(PARTS)}
    deleted = semel_cli("group", "delete", *groups, *boot)
    assert deleted.splitlines() == [f"deleted group {g}" for g in groups]
    assert not set(groups) & listed(cluster, 16)


def test_the_txn_cli_given_one_broker_reaches_every_coordinator_and_leader(cluster):
    """`semel txn` given broker 0 alone lists and describes transactions that other
    brokers coordinate, takes none of them, open in partitions other brokers lead, for
    a hanging one, and fences an id another broker coordinates."""
    settle(cluster)
    create(cluster, "cli-tx")
    assert {leader for leader, *_ in partitions(cluster, "cli-tx").values()} - {0}
    ids = [pick((f"tid-{i}" for i in range(200)), lambda t, p=p: partition_for(t, COUNT) == p)
           for p in range(COUNT)]
    elsewhere = next(t for t in ids if key_leader(cluster, TXN_TOPIC, t) != 0)
    producers = {}
    for t in ids:
        p = producers[t] = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": t,
                                     "transaction.timeout.ms": 600_000})
        p.init_transactions(30)
        p.begin_transaction()
        for q in range(PARTS):
            p.produce("cli-tx", value=t.encode(), partition=q)
        assert p.flush(30) == 0
    boot = ("--bootstrap", cluster.brokers[0].bootstrap)
    listed = {tuple(line.split("\t")[::2]) for line in semel_cli("txn", "list", *boot).splitlines()[1:]}
    assert {(t, "Ongoing") for t in ids} <= listed
    described = semel_cli("txn", "describe", elsewhere, *boot).splitlines()
    assert "state: Ongoing" in described and "partitions: cli-tx-0, cli-tx-1, cli-tx-2" in described
    assert semel_cli("txn", "find-hanging", "--topic", "cli-tx", *boot).strip() == "no hanging transactions"
    assert "its open transaction was aborted" in semel_cli("txn", "abort", "--transactional-id", elsewhere, *boot)
    with pytest.raises(KafkaException):
        producers.pop(elsewhere).commit_transaction(30)
    for p in producers.values():
        p.commit_transaction(30)
    got = read_values(cluster.bootstrap, "cli-tx", PARTS, want=PARTS * len(producers))
    assert sorted(got) == sorted(t for t in producers for _ in range(PARTS))


def test_a_broker_configured_with_another_count_coordinates_nothing():
    """Its ids would land on other partitions than its peers', so two brokers could serve
    one id: every id gets COORDINATOR_NOT_AVAILABLE there until the counts agree."""
    from types import SimpleNamespace

    from semel.coordinator.partitioned import PartitionedCoordinators
    seat = SimpleNamespace(error=lambda: KafkaError.NONE, topic=TXN_TOPIC)
    count = {"now": None}
    coordinators = PartitionedCoordinators([SimpleNamespace(seat=seat) for _ in range(3)], lambda: count["now"])
    assert coordinators.error_for("a") == KafkaError.NONE              # topic not created yet
    count["now"] = 3
    assert coordinators.error_for("a") == KafkaError.NONE
    count["now"] = 6
    assert coordinators.misplaced() and coordinators.error_for("a") == KafkaError.COORDINATOR_NOT_AVAILABLE

"""Partition reassignment on a real cluster (etcd and broker processes), as an operator
does it: kafka-python's admin client (alter_partition_reassignments,
list_partition_reassignments), a fourth broker added and partitions moved onto it while
a confluent-kafka transactional copy runs, and `semel topic reassign` with a plan its
--generate wrote.

- a move held back by the throttle shows in the list with its adding and removing
  replicas, acks=all writes go on meanwhile, and a cancel restores the original
  replicas; without the throttle the move finishes, the leader moves off a removed
  replica at the next epoch, and the new replica holds the leader's bytes;
- the copy running while every partition of its input and output moves ends exact
  (read_committed output == input, no loss, no duplicate) and the moved replicas hold
  the leader's bytes;
- the CLI's plan spreads the partitions evenly over the four brokers and --verify
  reports it done.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import TopicPartition as KTP
from kafka.admin import KafkaAdminClient

from semel.cli.topic_reassign import _set_throttle
from semel.client.client import Client
from semel.protocol.messages import request_class
from tests.support.cluster import module_cluster, partitions, wait_brokers
from tests.support.consume import read_values
from tests.support.copier import Copier
from tests.support.wait import in_background, until
from tests.support.markers import starts_processes


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "reassign", 3, 2, "--group-initial-rebalance-delay-ms", "0") as c:
        yield c


@pytest.fixture(scope="module")
def four(cluster):
    """The module's cluster with a fourth broker (node 3) added; it holds no replica yet."""
    cluster.add_broker()
    wait_brokers(cluster, {0, 1, 2, 3})
    return cluster


def create(cluster, topic: str, assignment: list[list[int]]) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    new = NewTopic(topic, len(assignment), replica_assignment=assignment, config={"min.insync.replicas": "2"})
    admin.create_topics([new])[topic].result(30)
    until(lambda: all(set(isr) == set(reps) for _, _, reps, isr in partitions(cluster, topic).values()),
          f"{topic}: full ISRs")


def produce(cluster, topic: str, values: list[str], parts: int, batches: int = 1) -> None:
    """acks=all, idempotent; value i to partition i % parts, in `batches` flushes (so many batches)."""
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 0})
    step = max(1, len(values) // batches)
    for first in range(0, len(values), step):
        for i in range(first, min(first + step, len(values))):
            p.produce(topic, value=values[i].encode(), partition=i % parts)
        assert p.flush(60) == 0


def log_bytes(cluster, node: int, topic: str, partition: int) -> bytes:
    """Every segment of the partition's log on broker `node`, concatenated in offset order."""
    (d,) = [d for d in (cluster.brokers[node].data_dir).rglob(f"{topic}-{partition}") if d.is_dir()]
    return b"".join(f.read_bytes() for f in sorted(d.glob("*.log")))


def same_bytes_as_leader(cluster, topic: str) -> bool:
    for p, (leader, _, replicas, isr) in partitions(cluster, topic).items():
        if set(isr) != set(replicas):
            return False
        want = log_bytes(cluster, leader, topic, p)
        if not want or any(log_bytes(cluster, r, topic, p) != want for r in replicas):
            return False
    return True


def no_reassignment(admin) -> bool:
    return admin.list_partition_reassignments() == {}


def test_kafka_python_admin_moves_a_partition_and_cancel_restores_it(cluster):
    create(cluster, "ra", [[0, 1], [1, 2]])
    produce(cluster, "ra", [f"a{i:03d}" for i in range(200)], 2, batches=5)
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        tp = KTP("ra", 0)
        with Client(cluster.brokers[0].bootstrap) as c:
            _set_throttle(c, 1)      # one batch, then nothing more for an hour: the move stays open
        assert admin.alter_partition_reassignments({tp: [2, 1]}) == {tp: None}
        moving = admin.list_partition_reassignments()
        assert moving == {tp: {"replicas": [2, 1, 0], "adding_replicas": [2], "removing_replicas": [0]}}
        assert admin.list_partition_reassignments([KTP("ra", 1)]) == {}
        produce(cluster, "ra", ["during"], 1)          # acks=all on the partition being moved
        _, _, replicas, isr = partitions(cluster, "ra")[0]
        assert replicas == (2, 1, 0) and 2 not in isr

        # A new target replaces the open one; a cancel restores the original replicas.
        assert admin.alter_partition_reassignments({tp: None}) == {tp: None}
        assert no_reassignment(admin)
        leader, _, replicas, isr = partitions(cluster, "ra")[0]
        assert replicas == (0, 1) and set(isr) == {0, 1} and leader == 0
        errors = admin.alter_partition_reassignments({tp: None})
        assert errors[tp] is not None and errors[tp].errno == 85      # NO_REASSIGNMENT_IN_PROGRESS

        with Client(cluster.brokers[0].bootstrap) as c:
            _set_throttle(c, None)
        _, epoch, _, _ = partitions(cluster, "ra")[0]
        assert admin.alter_partition_reassignments({tp: [2, 1]}) == {tp: None}
        until(lambda: no_reassignment(admin), "the move of ra-0 finished")
        leader, new_epoch, replicas, isr = partitions(cluster, "ra")[0]
        assert (replicas, set(isr)) == ((2, 1), {1, 2})
        assert leader == 2 and new_epoch == epoch + 1            # the removed leader handed over
        until(lambda: same_bytes_as_leader(cluster, "ra"), "ra's replicas hold the leader's bytes")
        assert sorted(read_values(cluster.bootstrap, "ra", 2, want=202)) == \
            sorted([f"a{i:03d}" for i in range(200)] + ["during"])
    finally:
        admin.close()


def test_a_fourth_broker_takes_partitions_while_a_transactional_copy_runs(four):
    cluster = four
    create(cluster, "mv-in", [[0, 1, 2], [1, 2, 0], [2, 0, 1]])
    create(cluster, "mv-out", [[0, 1, 2], [1, 2, 0], [2, 0, 1]])
    values = [f"v{i:04d}" for i in range(600)]
    produce(cluster, "mv-in", values, 3, batches=6)
    # Every partition gets broker 3 in place of its current leader: every leader moves.
    plan = {KTP(t, p): [3, *reps[1:]] for t in ("mv-in", "mv-out")
            for p, (_, _, reps, _) in partitions(cluster, t).items()}
    copier = Copier(cluster, "mv-in", "mv-out", "mv-copy")
    started, begun = threading.Event(), threading.Event()

    def on_commit(n: int) -> None:
        if n == 2:        # the rest of the copy runs once the move has begun
            started.set()
            assert begun.wait(60)
        time.sleep(0.05)
    worker, errors = in_background(lambda: copier.run({0: 200, 1: 200, 2: 200}, on_commit), started)
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        assert started.wait(120) and not errors
        with Client(cluster.brokers[0].bootstrap) as c:
            _set_throttle(c, 2000)     # the new replicas copy for seconds, under the copy's writes
        before = copier.commits
        assert admin.alter_partition_reassignments(plan) == {tp: None for tp in plan}
        begun.set()
        until(lambda: no_reassignment(admin), "every partition moved onto broker 3", timeout_s=120)
        during = copier.commits - before
    finally:
        begun.set()
        admin.close()
        with Client(cluster.brokers[0].bootstrap) as c:
            _set_throttle(c, None)
    worker.join(180)
    assert not worker.is_alive() and errors == []
    assert during > 0, "transactions committed while the partitions moved"
    for t in ("mv-in", "mv-out"):
        for p, (leader, _, replicas, _) in partitions(cluster, t).items():
            assert list(replicas) == plan[KTP(t, p)] and leader == 3
    assert sorted(read_values(cluster.bootstrap, "mv-out", 3, want=len(values))) == values
    until(lambda: same_bytes_as_leader(cluster, "mv-out"), "mv-out's replicas hold the leader's bytes")
    until(lambda: same_bytes_as_leader(cluster, "mv-in"), "mv-in's replicas hold the leader's bytes")


def cli(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "semel", "topic", "reassign", *args,
                           "--bootstrap", cluster.brokers[0].bootstrap], capture_output=True, text=True, timeout=60)


def broker_configs(cluster, node: int) -> dict[str, str]:
    """DescribeConfigs of the cluster-wide broker resource, as broker `node` answers it."""
    R = request_class(32).DescribeConfigsResource
    with Client(cluster.brokers[node].bootstrap) as c:
        resp = c.request(32, resources=[R(resource_type=4, resource_name="", configuration_keys=None)],
                         include_synonyms=False, include_documentation=False)
    return {e.name: e.value for e in resp.results[0].configs}


def test_cli_generates_a_plan_over_the_live_brokers_and_executes_it(four, tmp_path):
    cluster = four
    create(cluster, "cli-t", [[0, 1], [1, 2], [2, 0], [0, 2]])
    produce(cluster, "cli-t", [f"c{i:03d}" for i in range(100)], 4)
    gen = cli(cluster, "--generate", "--topics", "cli-t")
    assert gen.returncode == 0, gen.stderr
    assert '"cli-t"' in gen.stderr          # the current assignment, to go back to
    plan = tmp_path / "plan.json"
    plan.write_text(gen.stdout)
    import json
    planned = {(e["topic"], e["partition"]): e["replicas"] for e in json.loads(gen.stdout)["partitions"]}
    assert Counter(r for reps in planned.values() for r in reps) == {0: 2, 1: 2, 2: 2, 3: 2}
    assert Counter(reps[0] for reps in planned.values()) == {0: 1, 1: 1, 2: 1, 3: 1}
    run = cli(cluster, "--execute", "--plan", str(plan), "--throttle", "100000000")
    assert run.returncode == 0, run.stderr
    assert broker_configs(cluster, 1).get("leader.replication.throttled.rate") == "100000000"
    until(lambda: cli(cluster, "--verify", "--plan", str(plan)).returncode == 0, "the CLI's plan done")
    assert {(("cli-t", p)): list(reps) for p, (_, _, reps, _) in partitions(cluster, "cli-t").items()} == planned
    assert "leader.replication.throttled.rate" not in broker_configs(cluster, 2)    # --verify removed it
    listed = cli(cluster, "--list")
    assert listed.returncode == 0 and "no reassignment in progress" in listed.stdout
    until(lambda: same_bytes_as_leader(cluster, "cli-t"), "cli-t's replicas hold the leader's bytes")


def test_drain_a_broker_then_stop_it(four, tmp_path):
    """Decommission as docs/cluster.md tells it: a plan over the brokers that stay, for
    every topic (the internal ones too), executed and verified; then the broker stops
    and every partition still has a leader and its full ISR, the data is all there and
    a transactional copy runs on the coordinators that moved off it."""
    cluster = four
    with Client(cluster.brokers[1].bootstrap) as c:
        names = sorted(t.name for t in c.metadata(None).topics)
    assert "__consumer_offsets" in names and "__transaction_state" in names
    gen = cli(cluster, "--generate", "--brokers", "1,2,3", "--topics", ",".join(names))
    assert gen.returncode == 0, gen.stderr
    plan = tmp_path / "drain.json"
    plan.write_text(gen.stdout)
    run = cli(cluster, "--execute", "--plan", str(plan))
    assert run.returncode == 0, run.stderr
    until(lambda: cli(cluster, "--verify", "--plan", str(plan)).returncode == 0, "broker 0 drained",
          timeout_s=120)
    for t in names:
        assert all(0 not in reps for _, _, reps, _ in partitions(cluster, t).values()), t
    cluster.brokers[0].stop()
    wait_brokers(cluster, {1, 2, 3})
    for t in names:
        assert all(leader in reps and set(isr) == set(reps)
                   for leader, _, reps, isr in partitions(cluster, t).values()), t
    assert sorted(read_values(cluster.bootstrap, "mv-out", 3, want=600)) == [f"v{i:04d}" for i in range(600)]
    create(cluster, "after-in", [[1, 2, 3]])
    create(cluster, "after-out", [[2, 3, 1]])
    values = [f"w{i:03d}" for i in range(60)]
    produce(cluster, "after-in", values, 1)
    copier = Copier(cluster, "after-in", "after-out", "after-copy")
    copier.run({0: 60}, lambda n: None)
    assert sorted(read_values(cluster.bootstrap, "after-out", 1, want=60)) == values

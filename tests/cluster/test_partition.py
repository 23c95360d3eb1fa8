"""Network partitions of a 3-broker cluster (brokers, etcd and clients each in a network
namespace, links cut by the router: semel.launch.netns), under an idempotent acks=all
producer and a transactional copier (tests.support.partition_load).

Each cut lasts CUT_S. What must hold: no acknowledged record lost and none written
twice; acknowledgements flowing again on every partition in the second half of the
cut (a broker keeping clients on a stale leadership held them for the whole cut); the
copier committing again within its transaction timeout. The longest gaps are written
to bench/results/partition_gaps.json ("after"), not asserted.
"""
from __future__ import annotations

import os
import time

import pytest

from semel.launch.netns import available
from semel.protocol.errors import KafkaError
from tests.support.partition_nemesis import (BROKERS, LEASE_S, Load, NetnsCluster, check_safety, create_topic,
                                             leaders, measure, save, zombie_answers)
from tests.support.txn import call

WHY = available()
pytestmark = [pytest.mark.process,
              pytest.mark.skipif(WHY is not None and not os.environ.get("CI"), reason=f"no namespaces: {WHY}")]

CUT_S = 16
# Where the numbers go in the results file: "after" for this tree; a run on an older
# tree (with this harness copied in) sets PARTITION_RESULT_KEY=before.
RESULT_KEY = os.environ.get("PARTITION_RESULT_KEY", "after")
AFTER_HEAL_S = 6
TXN_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = NetnsCluster(tmp_path_factory.mktemp("partition")).start()
    try:
        yield c
    finally:
        c.close()


def run_cut(cluster, tmp_path, topic, cut, during=None):
    """Warm up the load, cut (cut(leader of partition 0, controller) -> description),
    run `during(leader, t_cut, t_heal)` meanwhile, heal, finish; the measured result."""
    create_topic(cluster, topic)
    load = Load(cluster, topic, tmp_path)
    try:
        load.warm()
        md = cluster.metadata(0, [topic])
        leader, controller = leaders(md)[0], md.controller_id
        t_cut = time.time()
        what = cut(leader, controller)
        t_heal = t_cut + CUT_S
        extra = during(leader, t_cut, t_heal) if during is not None else {}
        time.sleep(max(0.0, t_heal - time.time()))
        cluster.net.heal()
        t_heal = time.time()
        time.sleep(AFTER_HEAL_S)
    finally:
        cluster.net.heal()
        recs = load.finish()
    result = {"cut": what, "leader": leader, "controller": controller, **measure(recs, t_cut, t_heal), **extra}
    return recs, result


def assert_available(result):
    for p, n in result["acks_in_second_half"].items():
        assert n > 0, f"partition {p}: no acknowledgement in the second half of the cut: {result}"
    first = result["copier_first_commit_after_cut_s"]
    assert first is not None and first <= TXN_TIMEOUT_S, f"the copier did not commit again: {result}"


def others(node):
    return [h for h in BROKERS if h != BROKERS[node]]


def test_leader_cut_from_peers_and_etcd_but_reachable_by_clients(cluster, tmp_path):
    def cut(leader, _):
        for h in [*others(leader), "etcd"]:
            cluster.net.cut(BROKERS[leader], h)
        return f"b{leader} (leader of p0) from its peers and etcd; clients reach it"

    def zombie(leader, t_cut, t_heal):
        answers = zombie_answers(cluster, leader, topic, 0, t_heal - 1)
        md = cluster.metadata(leader, [topic])
        found = cluster.client(lambda c: call(c, 10, 3, key=f"copier-{topic}", key_type=1), leader)
        return {"zombie_answers": answers, "zombie_metadata": {"controller": md.controller_id,
                                                               "leaders": leaders(md)},
                "zombie_find_coordinator": KafkaError(found.error_code).name}
    topic = "cut-leader"
    recs, result = run_cut(cluster, tmp_path, topic, cut, zombie)
    save("leader_cut_from_peers_and_etcd", RESULT_KEY, result)
    check_safety(recs)
    assert result["zombie_answers"][-1][1] == KafkaError.NOT_LEADER_OR_FOLLOWER.name, result
    # The zombie answers NOT_LEADER by the time its lease would have ended (plus a probe).
    assert result["zombie_answers"][-1][0] <= LEASE_S + 2, result
    assert result["zombie_metadata"]["controller"] == -1
    assert result["zombie_find_coordinator"] == KafkaError.COORDINATOR_NOT_AVAILABLE.name, result
    assert result["leader"] not in result["zombie_metadata"]["leaders"].values()
    assert_available(result)


def test_broker_cut_from_everyone_but_etcd(cluster, tmp_path):
    def cut(leader, _):
        for h in [*others(leader), "client"]:
            cluster.net.cut(BROKERS[leader], h)
        return f"b{leader} (leader of p0) from its peers and the clients; etcd reaches it"
    recs, result = run_cut(cluster, tmp_path, "cut-all-but-etcd", cut)
    save("broker_cut_from_everyone_but_etcd", RESULT_KEY, result)
    check_safety(recs)
    assert_available(result)


def test_leader_that_cannot_hear_its_followers(cluster, tmp_path):
    def cut(leader, _):
        for h in others(leader):
            cluster.net.cut(h, BROKERS[leader], one_way=True)
        return f"b{leader} (leader of p0) hears nothing from its followers; all else flows"
    recs, result = run_cut(cluster, tmp_path, "cut-followers", cut)
    save("leader_cannot_hear_followers", RESULT_KEY, result)
    check_safety(recs)
    assert_available(result)


def test_controller_cut_from_etcd(cluster, tmp_path):
    topic = "cut-controller"

    def cut(_, controller):
        cluster.net.cut(BROKERS[controller], "etcd")
        return f"b{controller} (the controller) from etcd; peers and clients reach it"

    def stale(_, t_cut, t_heal):
        time.sleep(max(0.0, t_cut + LEASE_S + 1 - time.time()))
        controller = cluster_controller[0]
        md = cluster.metadata(controller, [topic])
        return {"controller_metadata_after_lease": {"controller": md.controller_id, "leaders": leaders(md)}}

    cluster_controller = []

    def cut_and_remember(leader, controller):
        cluster_controller.append(controller)
        return cut(leader, controller)
    recs, result = run_cut(cluster, tmp_path, topic, cut_and_remember, stale)
    save("controller_cut_from_etcd", RESULT_KEY, result)
    check_safety(recs)
    seen = result["controller_metadata_after_lease"]
    assert seen["controller"] == -1, result       # it names no controller, itself least of all
    assert all(l == -1 for l in seen["leaders"].values()), result
    assert_available(result)

"""Network partitions of a 3-broker cluster (brokers, etcd and clients each in a network
namespace, links cut by the router: semel.launch.netns), under an idempotent acks=all
producer and a transactional copier (tests.support.partition_load).

Each cut lasts CUT_S (SHORT_CUT_S for the later ones). What must hold: no acknowledged
record lost and none written twice; acknowledgements flowing again on every partition
in the second half of the cut (a broker keeping clients on a stale leadership held them
for the whole cut) where a majority stays connected; the copier committing again within
its transaction timeout; every partition and the copier moving on after the heal. The
longest gaps are written to bench/results/partition_gaps.json ("after"), not asserted.
"""
from __future__ import annotations

import os
import time

import pytest

from semel.launch.netns import available
from semel.protocol.errors import KafkaError
from tests.support.partition_nemesis import (BROKERS, LEASE_S, PARTS, Load, NetnsCluster, check_safety,
                                             create_topic, leaders, measure, save, zombie_answers)
from tests.support.cluster import agreed
from tests.support.txn import call
from tests.support.wait import until

WHY = available()
pytestmark = [pytest.mark.process,
              pytest.mark.skipif(WHY is not None and not os.environ.get("CI"), reason=f"no namespaces: {WHY}")]

# Long enough for a lease to run out and a hand-over (1.5 leases) to happen in the
# cut's first half, so its second half shows whether acknowledgements flow again; the
# first four scenarios keep the margin a loaded machine needs, the later ones are
# shorter to keep the module's run short.
CUT_S = 16
SHORT_CUT_S = 10
FLAP_S = 1.0
# Where the numbers go in the results file: PARTITION_RESULT_KEY=after records this
# tree's, =before an older tree's (with this harness copied in); unset, as in the suite,
# nothing is recorded, so a test run leaves the tree as it was.
RESULT_KEY = os.environ.get("PARTITION_RESULT_KEY")
TXN_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = NetnsCluster(tmp_path_factory.mktemp("partition")).start()
    try:
        yield c
    finally:
        c.close()


def run_cut(cluster, tmp_path, topic, cut, during=None, cut_s=CUT_S):
    """Warm up the load, cut (cut(leader of partition 0, controller) -> description),
    run `during(leader, t_cut, t_heal)` meanwhile, heal, wait until every partition and
    the copier moved on (bounded by the transaction timeout), finish; the measured result."""
    create_topic(cluster, topic)
    load = Load(cluster, topic, tmp_path)
    try:
        load.warm()
        leader = leaders(cluster.metadata(0, [topic]))[0]
        (controller,) = until(lambda: agreed(cluster.metadata(n, []).controller_id for n in range(3)),
                              "the brokers agree on the controller")
        t_cut = time.time()
        what = cut(leader, controller)
        t_heal = t_cut + cut_s
        extra = during(leader, t_cut, t_heal) if during is not None else {}
        time.sleep(max(0.0, t_heal - time.time()))
        cluster.net.heal()
        t_heal = time.time()
        deadline = time.monotonic() + TXN_TIMEOUT_S
        while not healed(load.records(), t_heal) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        cluster.net.heal()
        recs = load.finish()
    result = {"cut": what, "leader": leader, "controller": controller, **measure(recs, t_cut, t_heal), **extra}
    return recs, result


def cut_and_check(cluster, tmp_path, topic, name, cut, during=None, cut_s=CUT_S, available=True) -> dict:
    """run_cut, its result saved under `name`; then what every cut must keep: no
    acknowledged record lost or duplicated, the copy exact, progress after the heal and
    (with `available`) during the second half of the cut."""
    recs, result = run_cut(cluster, tmp_path, topic, cut, during, cut_s)
    save(name, RESULT_KEY, result)
    check_safety(recs, tmp_path / f"{topic}.load.log")
    if available:
        assert_available(result)
    assert_healed(result)
    return result


def healed(recs, t_heal) -> bool:
    """An acknowledgement on every partition and a copier commit, both after t_heal."""
    acked = {r["p"] for r in recs if r["kind"] == "ack" and r["t"] > t_heal}
    return acked == set(range(PARTS)) and any(r["kind"] == "commit" and r["t"] > t_heal for r in recs)


def assert_healed(result):
    for p, n in result["acks_after_heal"].items():
        assert n > 0, f"partition {p}: no acknowledgement after the heal: {result}"
    assert result["copier_commits_after_heal"] > 0, f"the copier did not commit after the heal: {result}"


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
    result = cut_and_check(cluster, tmp_path, topic, "leader_cut_from_peers_and_etcd", cut, zombie)
    assert result["zombie_answers"][-1][1] == KafkaError.NOT_LEADER_OR_FOLLOWER.name, result
    # The zombie answers NOT_LEADER by the time its lease would have ended (plus a probe).
    assert result["zombie_answers"][-1][0] <= LEASE_S + 2, result
    # It names another broker as controller, where admin requests can be served.
    assert result["zombie_metadata"]["controller"] in {0, 1, 2} - {result["leader"]}, result
    assert result["zombie_find_coordinator"] == KafkaError.COORDINATOR_NOT_AVAILABLE.name, result
    assert result["leader"] not in result["zombie_metadata"]["leaders"].values()


def test_broker_cut_from_everyone_but_etcd(cluster, tmp_path):
    def cut(leader, _):
        for h in [*others(leader), "client"]:
            cluster.net.cut(BROKERS[leader], h)
        return f"b{leader} (leader of p0) from its peers and the clients; etcd reaches it"
    cut_and_check(cluster, tmp_path, "cut-all-but-etcd", "broker_cut_from_everyone_but_etcd", cut)


def test_leader_that_cannot_hear_its_followers(cluster, tmp_path):
    def cut(leader, _):
        for h in others(leader):
            cluster.net.cut(h, BROKERS[leader], one_way=True)
        return f"b{leader} (leader of p0) hears nothing from its followers; all else flows"
    cut_and_check(cluster, tmp_path, "cut-followers", "leader_cannot_hear_followers", cut)


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
    result = cut_and_check(cluster, tmp_path, topic, "controller_cut_from_etcd", cut_and_remember, stale)
    seen = result["controller_metadata_after_lease"]
    # It names another broker, not itself, for admin requests.
    assert seen["controller"] in {0, 1, 2} - {result["controller"]}, result
    # ... and leads nothing; other brokers' leaderships it still names from its cache.
    assert result["controller"] not in seen["leaders"].values(), result


def test_split_two_one_with_the_controller_alone(cluster, tmp_path):
    def cut(_, controller):
        cluster.net.isolate(BROKERS[controller])
        return f"b{controller} (the controller) alone; its peers, etcd and the clients on the other side"
    cut_and_check(cluster, tmp_path, "split-2-1", "split_2_1_controller_alone", cut, cut_s=SHORT_CUT_S)


def test_leader_that_cannot_reach_its_followers(cluster, tmp_path):
    def cut(leader, _):
        for h in others(leader):
            cluster.net.cut(BROKERS[leader], h, one_way=True)
        return f"b{leader} (leader of p0) reaches no follower; they reach it, all else flows"
    cut_and_check(cluster, tmp_path, "cut-one-way", "leader_cannot_reach_followers", cut, cut_s=SHORT_CUT_S)


def test_leader_links_to_its_peers_flapping(cluster, tmp_path):
    def cut(leader, _):
        for h in others(leader):
            cluster.net.cut(BROKERS[leader], h)
        return f"b{leader} (leader of p0) from its peers, cut and healed every {FLAP_S:g} s"

    def flap(leader, _, t_heal):
        flips = 0
        while time.time() + FLAP_S < t_heal:
            time.sleep(FLAP_S)
            if cluster.net.cuts:
                cluster.net.heal()
            else:
                for h in others(leader):
                    cluster.net.cut(BROKERS[leader], h)
            flips += 1
        return {"flips": flips}
    # Progress inside a flapping cut is recorded, not required: a leader whose followers
    # come back within the lag bound is kept, and its writes may wait out each cut.
    result = cut_and_check(cluster, tmp_path, "cut-flapping", "leader_links_flapping", cut, flap, cut_s=SHORT_CUT_S,
                           available=False)
    assert result["flips"] >= 4, result      # the links did flap

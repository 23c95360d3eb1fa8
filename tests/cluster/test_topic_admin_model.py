"""Model test of topic deletion, re-creation and growth racing each other and leader
elections, on the real EtcdClusterView writers over an in-memory etcd
(tests/support/fake_etcd.py) whose calls interleave differently per seed.

Actors, concurrent on one event loop: two brokers each deleting, creating again and
growing the same topic through their own view; a controller electing new leaders
from a stale read (its CAS must fail on anything that changed); each broker's watch
delivering the committed events late, in order, with its local logs following
(`topic_sync.plan`) after every delivery.

Invariants after every committed write: a deleted topic has no partition key; a live
one has exactly partitions 0..n-1; each incarnation (topic id) is deleted at most once
and its partitions' leader epochs start at 0 and never go back; ids are never reused
and a live topic's retired ids name every earlier incarnation. After every watch
delivery: the view shows only partitions of the incarnation it holds live (none past its
count, none written for another topic id), never goes back to an older version, and local logs carry the view's topic ids.
Settled: every view equals a fresh read and every broker's logs match the cluster.
"""
from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, replace

import pytest

from semel.cluster.keys import Keys, decode_partition, decode_topic
from semel.cluster.metadata import EtcdClusterView
from semel.cluster.state import BrokerInfo
from semel.cluster.topic_sync import plan
from semel.protocol.errors import KafkaError
from tests.support.fake_etcd import FakeEtcd

T = "orders"
KEYS = Keys("model")


@dataclass
class Local:
    """One broker's local topic catalogue, as plan() reads it."""
    topic_id: str
    partitions: int


class Model:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.etcd = FakeEtcd(self.rng, self.check_store)
        self.views = [EtcdClusterView(self.etcd, "model", n, BrokerInfo(n, "127.0.0.1", 9092 + n)) for n in range(2)]
        self.cursor = [0, 0]
        self.local: list[dict[str, Local]] = [{}, {}]
        self.seen_ids: list[str] = []            # every topic id, in creation order
        self.deleted_ids: list[str] = []         # every id a deletion marker was written for
        self.epochs: dict[tuple[str, int], int] = {}
        self.owner: dict[tuple[int, int], str] = {}   # (partition, version) -> its topic id
        self.view_versions = [0, 0]
        self.deletes_ok = 0
        self.elections_ok = 0

    # -- invariants on the store, after every committed write -------------------------
    def check_store(self) -> None:
        kv = self.etcd.kvs.get(KEYS.topic(T))
        parts = {int(k.rsplit("/", 1)[1]): v for k, v in self.etcd.kvs.items() if k.startswith(KEYS.partitions + T + "/")}
        if kv is None:
            assert not parts
            return
        info = decode_topic(T, kv)
        if info.topic_id not in self.seen_ids:
            assert not info.deleted
            assert list(info.retired_ids) == self.seen_ids[-len(info.retired_ids):] if info.retired_ids else not self.seen_ids
            self.seen_ids.append(info.topic_id)
        if info.deleted:
            assert not parts, "a deleted topic kept partitions"
            if not self.deleted_ids or self.deleted_ids[-1] != info.topic_id:
                assert info.topic_id not in self.deleted_ids, "an incarnation deleted twice"
                self.deleted_ids.append(info.topic_id)
            return
        assert info.topic_id == self.seen_ids[-1], "a topic id came back"
        assert sorted(parts) == list(range(info.partitions)), f"partitions {sorted(parts)} of {info.partitions}"
        for p, pkv in parts.items():
            epoch = decode_partition(T, p, pkv).leader_epoch
            key = (info.topic_id, p)
            assert epoch >= self.epochs.get(key, 0), "a leader epoch went back"
            if key not in self.epochs:
                assert epoch == 0, "a new partition did not start at epoch 0"
            self.epochs[key] = epoch
            self.owner[(p, pkv.mod_revision)] = info.topic_id

    # -- invariants on a broker's view and logs, after every watch delivery ---------------
    def deliver(self, n: int, count: int) -> None:
        view = self.views[n]
        events = self.etcd.events[self.cursor[n]:self.cursor[n] + count]
        self.cursor[n] += len(events)
        for ev in events:
            view._apply(ev.kv, ev.kind == "DELETE", notify=True)
        self.follow(n)

    def follow(self, n: int) -> None:
        view = self.views[n]
        live, deleted = view.topics(), view.deleted_topics()
        for (topic, p), st in view._parts.items():
            assert topic in live, "the view shows a partition of a topic it does not hold live"
            assert p < live[topic].partitions, "the view shows more partitions than its topic has"
            assert self.owner[(p, st.version)] == live[topic].topic_id, "a partition of another incarnation"
        cur = live.get(T) or deleted.get(T)
        if cur is not None:
            assert cur.version >= self.view_versions[n], "the view went back to an older topic"
            self.view_versions[n] = cur.version
        todo = plan(self.local[n], live, deleted)
        for name in todo.drop:
            del self.local[n][name]
        for info in todo.create:
            self.local[n][info.name] = Local(info.topic_id, info.partitions)
        for name, count in todo.grow:
            self.local[n][name].partitions = count
        for name, info in live.items():
            assert self.local[n][name].topic_id == info.topic_id, "local logs of another incarnation"
        for name in deleted:
            assert name not in self.local[n]

    # -- actors -----------------------------------------------------------------------------------
    async def admin(self, n: int, rounds: int) -> None:
        view = self.views[n]
        for _ in range(rounds):
            what = self.rng.choice(["delete", "create", "grow", "grow"])
            if what == "delete":
                err = await view.delete_topic(T)
                assert err in (KafkaError.NONE, KafkaError.UNKNOWN_TOPIC_OR_PARTITION)
                self.deletes_ok += err == KafkaError.NONE
            elif what == "create":
                err = await view.create_topic(T, [(0, 1, 2)] * self.rng.randint(1, 3), {})
                assert err in (KafkaError.NONE, KafkaError.TOPIC_ALREADY_EXISTS)
            else:
                add = self.rng.randint(1, 2)
                err, _ = await view.add_partitions(T, lambda info: (KafkaError.NONE, "", [(1, 2, 0)] * add))
                assert err in (KafkaError.NONE, KafkaError.UNKNOWN_TOPIC_OR_PARTITION)
            self.follow(n)
            await asyncio.sleep(0)

    async def controller(self, rounds: int) -> None:
        """Elections decided on a read that may be stale by the time they are written."""
        view = self.views[0]
        for _ in range(rounds):
            kvs, _ = await self.etcd.get_prefix(KEYS.partitions + T + "/")
            if not kvs:
                await asyncio.sleep(0)
                continue
            kv = self.rng.choice(kvs)
            st = decode_partition(T, int(kv.key.rsplit("/", 1)[1]), kv)
            await asyncio.sleep(0)
            nxt = st.replicas[(st.replicas.index(st.leader) + 1) % len(st.replicas)]
            stored = await view.write_partition(st, replace(st, leader=nxt, leader_epoch=st.leader_epoch + 1))
            self.elections_ok += stored is not None

    async def watch(self, n: int) -> None:
        while not self.done:
            self.deliver(n, self.rng.randint(0, 3))
            await asyncio.sleep(0)

    async def run(self, rounds: int) -> None:
        self.done = False
        await self.views[0].create_topic(T, [(0, 1, 2)] * 2, {})
        watchers = [asyncio.create_task(self.watch(n)) for n in range(2)]
        await asyncio.gather(self.admin(0, rounds), self.admin(1, rounds), self.controller(rounds * 2))
        self.done = True
        await asyncio.gather(*watchers)
        for n in range(2):
            self.deliver(n, len(self.etcd.events))
            fresh = EtcdClusterView(self.etcd, "model", 9, BrokerInfo(9, "127.0.0.1", 1))
            await fresh._reload()
            view = self.views[n]
            assert view.topics() == fresh.topics() and view.deleted_topics() == fresh.deleted_topics()
            assert view._parts == fresh._parts


@pytest.mark.parametrize("seed", range(16))
def test_deletes_creates_and_growth_race_elections_safely(seed):
    m = Model(seed)
    asyncio.run(m.run(rounds=25))
    assert m.deletes_ok == len(m.deleted_ids), "a delete answered NONE without marking an incarnation"
    assert len(m.seen_ids) >= 1 and m.elections_ok > 0


def test_two_deleters_of_one_incarnation_one_wins():
    for seed in range(10):
        m = Model(seed)

        async def go():
            await m.views[0].create_topic(T, [(0, 1, 2)], {})
            return await asyncio.gather(m.views[0].delete_topic(T), m.views[1].delete_topic(T))
        got = asyncio.run(go())
        assert sorted(got) == [KafkaError.NONE, KafkaError.UNKNOWN_TOPIC_OR_PARTITION]
        assert len(m.deleted_ids) == 1


def test_an_election_decided_before_a_delete_never_brings_a_partition_back():
    for seed in range(10):
        m = Model(seed)

        async def go():
            await m.views[0].create_topic(T, [(0, 1, 2)], {})
            st = m.views[0].partition(T, 0)
            deleted = await m.views[1].delete_topic(T)
            stored = await m.views[0].write_partition(st, replace(st, leader=1, leader_epoch=1))
            return deleted, stored
        deleted, stored = asyncio.run(go())
        assert deleted == KafkaError.NONE and stored is None
        assert not [k for k in m.etcd.kvs if k.startswith(KEYS.partitions)]
        assert json.loads(m.etcd.kvs[KEYS.topic(T)].value)["deleted"] is True

"""The sink's routing (semel.client.cluster.ClusterRouter's coordinator and leader caches, as the
sink drives them) against a model cluster whose coordinators and leaders move, seeded.

No broker: a fake connection per broker answers as a Kafka broker would from the model's
current state (NOT_COORDINATOR / NOT_LEADER_OR_FOLLOWER where it no longer holds the
role) and moves roles at random while a request is in flight. Invariants, checked on
every request and after every step:
- a transaction request is only sent to the broker the cache names for its id, a
  Produce only to the broker the cache names as the partition's leader;
- after an answer saying a role moved, the stale entry is gone;
- every row reaches its partition exactly once, in order (a resend after a leader
  moved carries the same producer id, epoch and sequence, so a copy is dropped), and
  each InitProducerId ends on the current coordinator.
Also the producer's retry rounds on a fake clock: the request timeout counts from the
last round that sent something, not from the flush's start.
"""
from __future__ import annotations

import random
from types import SimpleNamespace as NS

import pytest

from semel.client.cluster import GROUP, TRANSACTION, ClusterRouter
from semel.protocol import records
from semel.protocol.errors import KafkaError
from semel.protocol.txn_hash import java_string_hash, partition_for
from semel.client import txn as wire
from semel.spark import branch_writer
from semel.spark import decision
from semel.spark import routing as spark_routing
from semel.spark.sink_options import SinkError, SinkOptions

E = KafkaError
NODES = (0, 1, 2)
TOPIC = "out"
PARTS = 4
COORDINATOR_PARTS = 6   # __transaction_state partitions: ids that hash alike share one


class World:
    """Who coordinates each id and leads each partition now, and the partitions' logs."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.coordinator: dict[tuple[int, str], int] = {}
        self.leader = {(TOPIC, p): rng.choice(NODES) for p in range(PARTS)}
        self.logs: dict[tuple[str, int], list[bytes]] = {tp: [] for tp in self.leader}
        self.next_seq: dict[tuple[str, int], int] = {tp: 0 for tp in self.leader}
        self.cluster: ClusterRouter | None = None
        self.move_p = 0.0

    def coord(self, key_type: int, key: str) -> int:
        return self.coordinator.setdefault((key_type, partition_for(key, COORDINATOR_PARTS)), self.rng.choice(NODES))

    def maybe_move(self) -> None:
        if self.rng.random() < self.move_p:
            if self.coordinator and self.rng.random() < 0.5:
                self.coordinator[self.rng.choice(sorted(self.coordinator))] = self.rng.choice(NODES)
            else:
                self.leader[(TOPIC, self.rng.randrange(PARTS))] = self.rng.choice(NODES)


def address(node: int) -> str:
    return f"b{node}:9092"


class FakeConn:
    def __init__(self, world: World, node: int):
        self.w, self.node = world, node
        self.pending: list = []

    def version(self, api_key: int) -> int:
        return 3

    def close(self) -> None:
        pass

    def idle_open(self) -> bool:
        return True

    def request(self, api_key: int, **fields):
        return self._answer(api_key, fields)

    def request_many(self, calls):
        return self.receive_many(self.send_many(calls))

    def send_many(self, calls):
        self.pending = [self._answer(k, dict(f)) for k, f in calls]
        return list(range(len(calls)))

    def receive_many(self, sent):
        out, self.pending = self.pending, []
        return out

    def _names(self, key_type: int, key: str) -> set[int]:
        """The brokers the cache names for key: its own entry, or (the sink's mode a) that
        of an id that hashes alike (a branch goes where its parent's entry says)."""
        h = java_string_hash(key)
        return {int(a[1]) for (t, k), a in self.w.cluster.coordinators.items()
                if t == key_type and java_string_hash(k) == h}

    def _answer(self, api_key: int, f: dict):
        w = self.w
        if api_key == 3:   # Metadata: any broker, the current leaders
            return NS(brokers=[NS(node_id=n, host=f"b{n}", port=9092) for n in NODES],
                      topics=[NS(name=TOPIC, error_code=0, partitions=[
                          NS(partition_index=p, leader_id=w.leader[(TOPIC, p)]) for p in range(PARTS)])])
        if api_key == 10:  # FindCoordinator: any broker
            n = w.coord(f["key_type"], f["key"])
            return NS(error_code=0, node_id=n, host=f"b{n}", port=9092)
        if api_key in (22, 24):
            txn_id = f.get("transactional_id") or f.get("v3_and_below_transactional_id")
            # the invariant: sent where the cache names this id's coordinator
            assert self.node in self._names(TRANSACTION, txn_id)
            w.maybe_move()
            err = E.NONE if w.coord(TRANSACTION, txn_id) == self.node else E.NOT_COORDINATOR
            if api_key == 22:
                return NS(error_code=err.value, producer_id=7, producer_epoch=0)
            return NS(results_by_topic_v3_and_below=[NS(name=t.name, results_by_partition=[
                NS(partition_index=p, partition_error_code=err.value) for p in t.partitions])
                for t in f["v3_and_below_topics"]])
        if api_key == 0:
            return self._produce(f)
        raise AssertionError(f"unexpected api key {api_key}")

    def _produce(self, f: dict):
        w = self.w
        answers = []
        for t in f["topic_data"]:
            for p in t.partition_data:
                tp = (t.name, p.index)
                assert w.cluster.brokers[w.cluster.leaders[tp]] == address(self.node)
                answers.append((tp, self._append(tp, p.records)))
        return NS(responses=[NS(name=tp[0], partition_responses=[NS(index=tp[1], error_code=err.value)])
                             for tp, err in answers])

    def _append(self, tp, data: bytes) -> KafkaError:
        w = self.w
        w.maybe_move()
        if w.leader[tp] != self.node:
            return E.NOT_LEADER_OR_FOLLOWER
        h = records.parse_header(data)
        if h.base_sequence < w.next_seq[tp]:
            return E.NONE   # a copy of what landed before: dropped, answered as success
        assert h.base_sequence == w.next_seq[tp], "a gap in the sequence"
        w.logs[tp].append(data)
        w.next_seq[tp] += h.record_count
        return E.NONE


class ModelRouter(ClusterRouter):
    def __init__(self, world: World):
        self.world = world
        world.cluster = self
        super().__init__("b0:9092", timeout_s=30, topics=[TOPIC])

    def _conn(self, address_: str):
        c = self._conns.get(address_)
        if c is None:
            c = self._conns[address_] = FakeConn(self.world, int(address_[1]))
        return c


def check_cache(cl: ModelRouter, err: KafkaError, coordinator=None, tp=None) -> None:
    """After seen(): an entry the error called stale is gone."""
    if coordinator is not None and err == E.NOT_COORDINATOR:
        assert (coordinator[1], coordinator[0]) not in cl.coordinators
    if tp is not None and err == E.NOT_LEADER_OR_FOLLOWER:
        assert tp not in cl.leaders


@pytest.mark.parametrize("seed", range(40))
def test_routing_follows_moves_and_every_row_lands_once(seed, monkeypatch):
    rng = random.Random(seed)
    monkeypatch.setattr(spark_routing.time, "sleep", lambda s: None)
    world = World(rng)
    cl = ModelRouter(world)
    world.move_p = rng.choice([0.05, 0.2, 0.4])
    seen = cl.seen

    def checked_seen(err, **kw):   # the cache invariant right after every answer
        out = seen(err, **kw)
        check_cache(cl, err, kw.get("coordinator"), kw.get("tp"))
        return out
    monkeypatch.setattr(cl, "seen", checked_seen)
    o = SinkOptions(bootstrap="b0:9092", group="g", parent="semel-spark-g", topic=TOPIC, checkpoint=None,
                    restart_window_ms=60_000, request_timeout_ms=5_000, batch_rows=rng.choice([3, 10, 1000]),
                    atomic=rng.random() < 0.5)
    sent: dict = {}
    for step in range(rng.randint(5, 15)):
        txn_id = decision.branch_id(o, step, 0, 0)
        st = spark_routing.init_transaction(cl, o, txn_id)
        # the id's current coordinator is the one the cache names once it succeeded (mode
        # a: under the parent's entry, no FindCoordinator of its own)
        key = o.parent if o.atomic else txn_id
        assert (TRANSACTION, txn_id) not in cl.coordinators or not o.atomic
        assert int(cl.coordinators[(TRANSACTION, key)][1]) == world.coord(TRANSACTION, txn_id)
        producer = branch_writer._BranchProducer(o, cl, st)
        for i in range(rng.randint(0, 40)):
            p = rng.randrange(PARTS)
            producer.add(TOPIC, p, (None, f"s{step}-{i}".encode(), []))
            sent.setdefault((TOPIC, p), []).append(f"s{step}-{i}")
        producer.flush()
        assert not producer.ready
        # a sequence per (id, partition): the model's log checks it per partition, so
        # each step's producer continues where the last one ended
        for tp in world.next_seq:
            world.next_seq[tp] = 0
    for tp, batches_ in world.logs.items():
        got = [r.value.decode() for b in batches_ for r in records.iter_records(b)]
        assert got == [v for v in sent.get(tp, [])]
    assert GROUP not in {k[0] for k in cl.coordinators}


class FlakyProducer(branch_writer._BranchProducer):
    """Partition 1's one chunk is refused NOT_ENOUGH_REPLICAS for its first `refusals`
    rounds; partition 0's go through. Each round takes 0.6 s of a
    fake clock (the request timeout is 1 s)."""

    def __init__(self, o, clock: list, refusals: int):
        super().__init__(o, None, wire.TxnState("t", 7, 0))
        self.clock, self.refusals = clock, refusals

    def _round(self, data, new, tail):
        self.clock[0] += 0.6
        produced = {}
        for tp in data:
            if tp[1] == 1 and self.refusals > 0:
                self.refusals -= 1
                produced[tp] = E.NOT_ENOUGH_REPLICAS
            else:
                produced[tp] = E.NONE
        return {tp: E.NONE for tp in new}, produced, None


def test_a_flush_that_keeps_making_progress_is_not_cut_off(monkeypatch):
    """The request timeout counts from the last round that sent something: partition 1 is
    refused for 6 rounds (3.6 s) while partition 0 moves each round, and it still lands."""
    producer = flaky_flush(monkeypatch, rows_p0=8, refusals=6)
    assert producer.counts == {(TOPIC, 0): 8, (TOPIC, 1): 1}


def flaky_flush(monkeypatch, rows_p0: int, refusals: int) -> FlakyProducer:
    """Partition 1's row first, then `rows_p0` rows of partition 0 in a chunk each (one
    round each), all sent by one flush."""
    clock = [0.0]
    fake = NS(monotonic=lambda: clock[0], sleep=lambda s: None, perf_counter=lambda: clock[0], time=lambda: clock[0])
    monkeypatch.setattr(spark_routing, "time", fake)
    monkeypatch.setattr(branch_writer, "time", fake)
    o = SinkOptions(bootstrap="x:1", group="g", parent="p", topic=TOPIC, checkpoint=None,
                    restart_window_ms=60_000, request_timeout_ms=1_000, batch_rows=1000)
    producer = FlakyProducer(o, clock, refusals)
    producer.add(TOPIC, 1, (None, b"b", []))
    for i in range(rows_p0):
        producer.add(TOPIC, 0, (None, b"a%d" % i, []))
        producer._seal((TOPIC, 0))
    producer.flush()
    return producer


def test_a_flush_without_progress_gives_up_after_the_request_timeout(monkeypatch):
    with pytest.raises(SinkError, match="Produce out-1: NOT_ENOUGH_REPLICAS"):
        flaky_flush(monkeypatch, rows_p0=0, refusals=10**6)

"""Zombie fencing when instances of one transactional id initialise at the same
instant, with unmodified confluent-kafka, kafka-python and aiokafka
producers against one real broker process.

Each round starts several instances of an already-initialised transactional id
in threads released by one barrier; each calls init_transactions, begins,
produces one record to a one-partition topic, waits, and commits. Kafka's rule:
every init fences the instances initialised before it, so at most one instance
of a round commits, its record is readable under read_committed, and the others
fail with their client's fencing error."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from semel.client import Client
from tests.support.brokers import module_broker
from tests.support.consume import read_values

TOPIC = "zombie"
TXN_ID = "zombie-app"
# Instances per round, rotating so each client meets each other client.
LINEUPS = [("ck", "kp", "aio"), ("aio", "ck", "ck"), ("kp", "aio", "kp"), ("ck", "ck", "kp"), ("kp", "kp", "ck"),
           ("aio", "aio", "ck"), ("ck", "ck", "ck"), ("ck", "kp", "aio", "ck")]
# What a fenced instance may be told, per client (its name for PRODUCER_FENCED /
# INVALID_PRODUCER_EPOCH, or the fatal/abortable state its client enters then).
FENCING_WORDS = ("fenced", "invalid_producer_epoch", "invalidproducerepoch", "producer_fenced",
                 "producerfenced", "epoch")


@pytest.fixture(scope="module")
def zbroker(tmp_path_factory):
    with module_broker(tmp_path_factory, "zombie", "--transaction-abort-check-interval-ms", "200") as b:
        with Client(b.bootstrap) as c:
            c.create_topic(TOPIC, 1)
        yield b


def _ck(bootstrap: str, value: str, barrier: threading.Barrier) -> None:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": TXN_ID, "linger.ms": 1})
    p.list_topics(TOPIC, timeout=30)   # connected before the barrier, so the inits coincide
    barrier.wait()
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(TOPIC, value=value)
    p.flush(10)
    time.sleep(1)   # the scenario's pause, so every other instance has initialised meanwhile
    p.commit_transaction(30)


def _kp(bootstrap: str, value: str, barrier: threading.Barrier) -> None:
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=TXN_ID)
    try:
        p.partitions_for(TOPIC)        # connected before the barrier
        barrier.wait()
        p.init_transactions()
        p.begin_transaction()
        p.send(TOPIC, value.encode()).get(timeout=30)
        time.sleep(1)
        p.commit_transaction()
    finally:
        p.close(timeout=5)


def _aio(bootstrap: str, value: str, barrier: threading.Barrier) -> None:
    async def run():
        from aiokafka import AIOKafkaProducer
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=TXN_ID)
        barrier.wait()   # blocks this thread's own loop only
        await p.start()  # InitProducerId
        try:
            await p.begin_transaction()
            await p.send_and_wait(TOPIC, value.encode())
            await asyncio.sleep(1)
            await p.commit_transaction()
        finally:
            await p.stop()
    asyncio.run(run())


INSTANCES = {"ck": _ck, "kp": _kp, "aio": _aio}


def _round(bootstrap: str, rnd: int, lineup: tuple[str, ...]) -> dict[str, str | None]:
    """value -> None if its instance committed, else the text of the exception it ended with.
    Text, not the exception: its traceback would keep the instance's producer alive (in a
    reference cycle) until a garbage collection after its broker stopped, and librdkafka
    would log failed connects then, after pytest's summary."""
    barrier = threading.Barrier(len(lineup))
    outcome: dict[str, str | None] = {}

    def instance(kind: str, value: str) -> None:
        try:
            INSTANCES[kind](bootstrap, value, barrier)
            outcome[value] = None
        except BaseException as exc:   # noqa: BLE001 - the outcome is what the test judges
            outcome[value] = f"{type(exc).__name__} {exc!r} {exc}"

    threads = [threading.Thread(target=instance, args=(kind, f"r{rnd}-{i}-{kind}"), daemon=True)
               for i, kind in enumerate(lineup)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "an instance hung"
    return outcome


def _is_fencing(text: str) -> bool:
    return any(word in text.lower() for word in FENCING_WORDS)


def test_concurrent_inits_of_one_transactional_id_let_at_most_one_commit(zbroker):
    from confluent_kafka import Producer
    first = Producer({"bootstrap.servers": zbroker.bootstrap, "transactional.id": TXN_ID})
    first.init_transactions(30)    # the id is already initialised when the rounds start
    del first

    committed: list[str] = []
    for rnd, lineup in enumerate(LINEUPS):
        outcome = _round(zbroker.bootstrap, rnd, lineup)
        winners = [v for v, exc in outcome.items() if exc is None]
        assert len(winners) <= 1, f"round {rnd}: {winners} all committed"
        for value, exc in outcome.items():
            if exc is not None:
                assert _is_fencing(exc), f"round {rnd}: {value} failed without a fencing error: {exc}"
        committed += winners

    assert committed, "no round had a winner: the last instance to initialise must be able to commit"
    visible = read_values(zbroker.bootstrap, TOPIC, 1, "read_committed", want=len(committed))
    assert sorted(visible) == sorted(committed)

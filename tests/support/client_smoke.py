"""A round trip of every Kafka client against a semel broker, both from the Python that
runs this file: tests/integration/test_client_versions.py runs it in venvs holding the
oldest and the newest client versions pyproject.toml allows.

Run as a script (`python tests/support/client_smoke.py`); it imports nothing from
tests/, only the installed semel and the clients. Its last line names the versions:
`smoke ok: confluent-kafka X kafka-python Y aiokafka Z`."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

RECORDS = [f"r{i}".encode() for i in range(10)]
TOPICS = ("ck", "ck-txn", "kp", "aio", "cli")


def confluent_round_trip(bootstrap: str) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in TOPICS]).values():
        future.result(30)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for v in RECORDS:
        p.produce("ck", v)
    assert p.flush(30) == 0, "confluent-kafka: records left unsent"
    got = confluent_read(bootstrap, "ck", "read_uncommitted", len(RECORDS))
    assert got == RECORDS, f"confluent-kafka read back {got}"


def confluent_transaction(bootstrap: str) -> None:
    """One committed and one aborted transaction: a read_committed reader sees the first only."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "smoke"})
    p.init_transactions(30)
    p.begin_transaction()
    for v in RECORDS[:3]:
        p.produce("ck-txn", v)
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce("ck-txn", b"aborted")
    p.abort_transaction(30)
    got = confluent_read(bootstrap, "ck-txn", "read_committed", 3)
    assert got == RECORDS[:3], f"confluent-kafka read_committed read {got}"


def confluent_read(bootstrap: str, topic: str, isolation: str, want: int) -> list[bytes]:
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"smoke-{topic}", "auto.offset.reset": "earliest",
                  "isolation.level": isolation})
    c.subscribe([topic])
    got: list[bytes] = []
    try:
        for _ in range(120):
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
            if len(got) >= want:
                # one more poll: an aborted record (or anything extra) would show up here
                extra = c.poll(1.0)
                if extra is not None and extra.error() is None:
                    got.append(extra.value())
                break
    finally:
        c.close()
    return got


def kafka_python_round_trip(bootstrap: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for v in RECORDS:
        p.send("kp", v)
    p.flush(30)
    p.close()
    c = KafkaConsumer("kp", bootstrap_servers=bootstrap, group_id="smoke-kp", auto_offset_reset="earliest",
                      consumer_timeout_ms=15000)
    got = []
    for m in c:
        got.append(m.value)
        if len(got) == len(RECORDS):
            break
    c.close()
    assert got == RECORDS, f"kafka-python read back {got}"


async def aiokafka_round_trip(bootstrap: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    try:
        for v in RECORDS:
            await p.send_and_wait("aio", v)
    finally:
        await p.stop()
    c = AIOKafkaConsumer("aio", bootstrap_servers=bootstrap, group_id="smoke-aio", auto_offset_reset="earliest")
    await c.start()
    got: list[bytes] = []
    try:
        async with asyncio.timeout(30):
            while len(got) < len(RECORDS):
                for msgs in (await c.getmany(timeout_ms=500)).values():
                    got.extend(m.value for m in msgs)
    finally:
        await c.stop()
    assert got == RECORDS, f"aiokafka read back {got}"


def cli_round_trip(bootstrap: str) -> None:
    """semel's own commands on the same client: `semel produce` (idempotent, acks=all) and
    `semel consume`."""
    semel = [sys.executable, "-m", "semel"]
    values = [v.decode() for v in RECORDS]
    subprocess.run(semel + ["produce", "cli", "--bootstrap", bootstrap] + [a for v in values for a in ("--value", v)],
                   check=True, timeout=60)
    out = subprocess.run(semel + ["consume", "cli", "--bootstrap", bootstrap, "--from-beginning",
                                  "--max-messages", str(len(values)), "--timeout", "15"],
                         check=True, timeout=60, capture_output=True, text=True).stdout
    assert out.splitlines() == values, f"semel consume printed {out!r}"


def versions() -> str:
    from importlib.metadata import version
    return " ".join(f"{d} {version(d)}" for d in ("confluent-kafka", "kafka-python", "aiokafka"))


def main() -> None:
    from semel.launch.process import SemelBroker
    with tempfile.TemporaryDirectory(prefix="semel-smoke-") as d:
        with SemelBroker(Path(d) / "data", log_path=Path(d) / "broker.log") as broker:
            try:
                confluent_round_trip(broker.bootstrap)
                confluent_transaction(broker.bootstrap)
                cli_round_trip(broker.bootstrap)
                kafka_python_round_trip(broker.bootstrap)
                asyncio.run(aiokafka_round_trip(broker.bootstrap))
            except BaseException:
                print((Path(d) / "broker.log").read_text()[-3000:])
                raise
    print(f"smoke ok: {versions()}")


if __name__ == "__main__":
    main()

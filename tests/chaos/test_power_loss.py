"""One broker on a power-cut disk (semel.launch.lazyfs): the power goes at random
moments under an idempotent acks=all producer and a transactional copier.

SIGKILL alone keeps the page cache, so it cannot show that the broker fsyncs what it
acknowledges; a cut of the power-cut disk drops everything not fsynced. With the
default --flush-mode always every acknowledged record, committed offset and committed
transaction must survive every cut, and the broker must always come back (a torn
tail is cut off, never refused). The control run with --flush-mode never shows the
disk really loses what was not fsynced.

Seeded (SEMEL_CHAOS_SEED, default 5); cuts from SEMEL_POWER_CUTS (default 4).
"""
from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

from semel.client import Client
from semel.launch.process import SemelBroker
from tests.support.consume import read_values
from tests.support.copier import Copier
from tests.support.powercut import power_cut_disk
from tests.support.wait import until

PARTITIONS = 3
# Small segments and internal logs rewritten often: the cuts also fall on segment rolls,
# index and snapshot files and the compaction of the offsets and transaction logs.
STORAGE_ARGS = ("--segment-bytes", "32768", "--offsets-log-segment-bytes", "32768",
                "--transaction-log-segment-bytes", "32768", "--offsets-log-compact-records", "200",
                "--transaction-log-compact-records", "200")
NOT_YET = 1 << 62     # a copier's end offset before the producer has finished


class Producing:
    """An idempotent acks=all producer in a thread, keeping every acknowledged value; it
    sends n records, or with n=None until stop() (so every cut falls under load)."""

    def __init__(self, bootstrap: str, topic: str, n: int | None):
        from confluent_kafka import Producer
        self.topic, self.n = topic, n
        self.sent = 0
        self._stop = threading.Event()
        self.acked: list[str] = []
        self.failed: list[str] = []
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 5, "message.timeout.ms": 300000, "retry.backoff.ms": 100,
                                  "reconnect.backoff.max.ms": 500})
        self.thread = threading.Thread(target=self._run, name="power-producer", daemon=True)

    def _on_delivery(self, err, msg):
        if err is None:
            self.acked.append(msg.value().decode())
        else:
            self.failed.append(str(err))

    def stop(self) -> None:
        self._stop.set()

    def _run(self):
        i = 0
        while (i < self.n) if self.n is not None else not self._stop.is_set():
            while True:
                try:
                    self.producer.produce(self.topic, key=str(i % 31), value=f"v{i}",
                                          on_delivery=self._on_delivery)
                    break
                except BufferError:
                    self.producer.poll(0.05)
            self.producer.poll(0)
            i += 1
            if i % 50 == 0:
                time.sleep(0.01)
        self.sent = i
        self.producer.flush(300)


def _broker(disk, tmp_path, *args: str, env: dict[str, str] | None = None) -> SemelBroker:
    return SemelBroker(disk.mount / "data", log_path=tmp_path / "broker.log", extra_args=list(args), env=env)


def _faultable_broker(disk, tmp_path) -> SemelBroker:
    """A broker whose file-system faults are armed at run time (_arm_faults)."""
    return _broker(disk, tmp_path, env={"SEMEL_FS_FAULTS": f"control_file={tmp_path / 'faults'}"})


def _arm_faults(control_file, spec: str) -> None:
    """Arm file-system faults in a running broker (semel/storage/fs.py: control_file);
    returns once it took them."""
    tmp = control_file.with_name(control_file.name + ".tmp")
    tmp.write_text(spec)
    os.replace(tmp, control_file)
    until(lambda: not control_file.exists(), f"the broker taking the fault spec {spec!r}")


def _ends(bootstrap: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(PARTITIONS)}
    finally:
        c.close()


def test_acknowledged_records_and_copied_transactions_survive_power_cuts(tmp_path):
    seed = int(os.environ.get("SEMEL_CHAOS_SEED", "5"))
    cuts = int(os.environ.get("SEMEL_POWER_CUTS", "4"))
    rng = random.Random(seed)
    with power_cut_disk(tmp_path, seed=seed) as disk:
        broker = _broker(disk, tmp_path, "--transaction-abort-check-interval-ms", "200", *STORAGE_ARGS)
        broker.start()
        try:
            with Client(broker.bootstrap) as c:
                c.create_topic("in", PARTITIONS)
                c.create_topic("out", PARTITIONS)
            producing = Producing(broker.bootstrap, "in", None)
            copier = Copier(broker, "in", "out", "power-copier")
            ends = {p: NOT_YET for p in range(PARTITIONS)}
            copy_errors: list[BaseException] = []

            def copy():
                try:
                    copier.run(ends, lambda n: None)
                except BaseException as exc:   # shown by the assertion below
                    copy_errors.append(exc)

            copying = threading.Thread(target=copy, name="power-copier", daemon=True)
            producing.thread.start()
            copying.start()
            restarts = 0
            for _ in range(cuts):
                time.sleep(rng.uniform(0.5, 3.0))
                # The power goes for both at once: either the broker dies first, or the
                # disk does and the broker's last syscalls fail before it dies too. A
                # torn cut leaves part of the unsynced writes (a torn tail, index garbage).
                torn = rng.random() < 0.5
                if rng.random() < 0.5:
                    broker.kill()
                    disk.power_off(torn=torn)
                else:
                    disk.power_off(torn=torn)
                    broker.kill()
                disk.start()
                broker.start()           # raises if the broker refuses its own data
                restarts += 1
            producing.stop()
            producing.thread.join(600)
            assert not producing.thread.is_alive(), "the producer never finished"
            assert producing.failed == [], producing.failed[:3]
            ends.update(_ends(broker.bootstrap, "in"))
            copying.join(600)
            assert not copying.is_alive(), f"the copy never finished: {copier.failures[-3:]}"
            assert copy_errors == [], copy_errors

            assert restarts == cuts and disk.cuts == cuts
            sent = producing.sent
            stored = read_values(broker.bootstrap, "in", PARTITIONS, "read_uncommitted", idle_s=3.0, want=sent)
            counts = Counter(stored)
            assert sent > 0 and len(producing.acked) == sent
            assert [v for v in producing.acked if counts[v] == 0] == [], "acknowledged records lost"
            assert [v for v, n in counts.items() if n > 1] == [], "records stored twice"
            copied = read_values(broker.bootstrap, "out", PARTITIONS, "read_committed", idle_s=3.0, want=sent)
            assert Counter(copied) == counts, "the copy is not every input exactly once"
            assert copier.commits > 0
        finally:
            broker.close()


def test_without_fsync_a_power_cut_loses_acknowledged_records(tmp_path):
    """The control: --flush-mode never acknowledges from the page cache, and a cut loses it."""
    with power_cut_disk(tmp_path) as disk:
        broker = _broker(disk, tmp_path, "--flush-mode", "never", *STORAGE_ARGS)
        broker.start()
        try:
            with Client(broker.bootstrap) as c:
                c.create_topic("in", PARTITIONS)
            disk.sync()
            producing = Producing(broker.bootstrap, "in", 500)
            producing.thread.start()
            producing.thread.join(120)
            assert not producing.thread.is_alive() and len(producing.acked) == 500
            broker.kill()
            disk.cut()
            broker.start()
            stored = set(read_values(broker.bootstrap, "in", PARTITIONS, "read_uncommitted", idle_s=2.0))
            lost = [v for v in producing.acked if v not in stored]
            assert lost, "a power cut kept records that were never fsynced"
        finally:
            broker.close()


def test_acknowledged_topic_offsets_and_record_survive_an_immediate_cut(tmp_path):
    """Each acknowledgement is on the disk when it is sent: a cut right after them keeps
    the topic, the group's committed offsets and the record."""
    from confluent_kafka import Consumer, TopicPartition
    with power_cut_disk(tmp_path) as disk:
        broker = _broker(disk, tmp_path)
        broker.start()
        try:
            with Client(broker.bootstrap) as c:
                c.create_topic("meta", PARTITIONS)
            consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "keeper",
                                 "enable.auto.commit": False})
            consumer.commit(offsets=[TopicPartition("meta", p, 10 + p) for p in range(PARTITIONS)],
                            asynchronous=False)
            consumer.close()
            producing = Producing(broker.bootstrap, "meta", 1)
            producing.thread.start()
            producing.thread.join(60)
            assert producing.acked == ["v0"]
            broker.kill()
            disk.cut()
            broker.start()
            consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "keeper",
                                 "enable.auto.commit": False})
            got = consumer.committed([TopicPartition("meta", p) for p in range(PARTITIONS)], timeout=30)
            consumer.close()
            assert [tp.offset for tp in got] == [10 + p for p in range(PARTITIONS)]
            assert read_values(broker.bootstrap, "meta", PARTITIONS, "read_uncommitted", want=1) == ["v0"]
        finally:
            broker.close()


def test_a_record_a_reader_saw_survives_a_power_cut(tmp_path):
    """Readers see a record only once it is fsynced, whatever the producer's acks: a
    record read and then lost would leave a reader's committed offset past the log end
    (a copier then rewinds to the earliest offset and copies twice). Slow fsyncs, armed
    once the topic exists, hold the record in the page cache long enough for a reader
    that is shown it early to see it before the cut."""
    from confluent_kafka import Producer
    with power_cut_disk(tmp_path) as disk:
        broker = _faultable_broker(disk, tmp_path)
        broker.start()
        try:
            with Client(broker.bootstrap) as c:
                c.create_topic("seen", 1)
            _arm_faults(tmp_path / "faults", "fsync_delay_ms=1500")
            producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": 1})
            producer.produce("seen", value=b"v0")
            assert producer.flush(30) == 0
            assert read_values(broker.bootstrap, "seen", 1, "read_committed", idle_s=30.0, want=1) == ["v0"]
            broker.kill()
            disk.cut()
            broker.start()
            assert read_values(broker.bootstrap, "seen", 1, "read_committed", want=1) == ["v0"]
        finally:
            broker.close()


def test_a_record_retried_after_a_failed_fsync_survives_a_power_cut(tmp_path):
    """A failed fsync may drop the pages it was writing and report the error once
    (drop=1 zeroes them, as Linux may): the idempotent producer's retry must be written
    and fsynced again, not answered as a duplicate of bytes the cut takes
    (storage/fsync_repair.py). Every acknowledged record survives, exactly once."""
    from confluent_kafka import Producer
    with power_cut_disk(tmp_path) as disk:
        broker = _faultable_broker(disk, tmp_path)
        broker.start()
        try:
            with Client(broker.bootstrap) as c:
                c.create_topic("fg", 1)
            acked: list[str] = []

            def on_delivery(err, msg) -> None:
                if err is None:
                    acked.append(msg.value().decode())
            producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                                 "acks": "all", "linger.ms": 0})
            producer.produce("fg", value=b"v0", on_delivery=on_delivery)
            assert producer.flush(30) == 0
            _arm_faults(tmp_path / "faults", "fail_next_fsync=1,drop=1,path_contains=fg-0/00000000000000000000.log")
            for v in (b"v1", b"v2"):
                producer.produce("fg", value=v, on_delivery=on_delivery)
                assert producer.flush(60) == 0
            assert acked == ["v0", "v1", "v2"]
            assert "fsync failed; records from offset 1 on are cut back" in (tmp_path / "broker.log").read_text()
            broker.kill()
            disk.cut()
            broker.start()
            assert read_values(broker.bootstrap, "fg", 1, "read_uncommitted", want=3) == ["v0", "v1", "v2"]
        finally:
            broker.close()

"""The Prometheus endpoint after a known workload: the seed's transaction and
idempotence metrics with exact values, per-API counts and latency histograms,
bytes in/out, and per-partition high watermark / LSO / gap / ISR. A real broker process,
confluent-kafka for the transactions, the byte-exact client for the timeout and
for re-sent batches; `semel txn stats` reads the same counters."""
from __future__ import annotations

import subprocess
import sys
import urllib.request

import pytest
from support import wait
from support.brokers import module_broker
from support.txn import RawTxn

from semel.client import Client
from semel.launch.process import free_port
from semel.protocol import records
from semel.protocol.errors import KafkaError

COMMITS, ABORTS, RESENDS = 3, 2, 4
TOPIC = "metered"


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    port = free_port()
    with module_broker(tmp_path_factory, "ops-metrics", "--metrics-port", str(port),
                       "--transaction-abort-check-interval-ms", "100") as b:
        b.metrics_port = port
        yield b


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def _transactions(bootstrap: str) -> None:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "metered-tx", "linger.ms": 0})
    p.init_transactions(30)
    for i in range(COMMITS + ABORTS):
        p.begin_transaction()
        p.produce(TOPIC, f"v{i}".encode(), partition=i % 2)
        p.flush(30)
        if i < COMMITS:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
    p.flush(30)


def _timed_out_transaction(c: Client) -> int:
    t = RawTxn(c, "metered-timeout", timeout_ms=1000)
    assert t.init() == KafkaError.NONE
    assert t.add((TOPIC, 0)) == {(TOPIC, 0): KafkaError.NONE}
    assert t.produce(TOPIC, 0, b"left-open")[0] == KafkaError.NONE
    return t.pid


def _resent_batch(c: Client) -> int:
    """An idempotent batch sent once and then RESENDS times more, as a producer
    retrying after lost acknowledgements would."""
    r = c.request(22, transactional_id=None, transaction_timeout_ms=1000, producer_id=-1, producer_epoch=-1)
    batch = records.build_batch([(None, b"once")], producer_id=r.producer_id, producer_epoch=r.producer_epoch,
                                base_sequence=0)
    first = c.produce(TOPIC, 1, batch)
    assert first[0] == KafkaError.NONE
    for _ in range(RESENDS):
        assert c.produce(TOPIC, 1, batch) == first   # the original offset, nothing written twice
    return r.producer_id


def test_metrics_after_a_known_workload(metered):
    port = metered.metrics_port
    with Client(metered.bootstrap) as c:
        assert c.create_topic(TOPIC, 2) == KafkaError.NONE
        _transactions(metered.bootstrap)
        timeout_pid = _timed_out_transaction(c)
        wait.until(lambda: value(scrape(port), "semel_transactions_timed_out_total") == 1,
                   "the coordinator aborts the transaction that outlived its timeout")
        _resent_batch(c)
        ends = {p: (c.list_offset(TOPIC, p, -1), c.list_offset(TOPIC, p, -1, isolation=1)) for p in (0, 1)}
    s = scrape(port)
    assert value(s, "semel_transactions_started_total") == COMMITS + ABORTS + 1
    assert value(s, "semel_transactions_committed_total") == COMMITS
    assert value(s, "semel_transactions_aborted_total") == ABORTS + 1      # the timed-out one is aborted too
    assert value(s, "semel_transactions_timed_out_total") == 1
    assert value(s, "semel_transactions_active") == 0
    assert value(s, "semel_idempotent_duplicates_total") == RESENDS
    # confluent's transactional producer, the timed-out one (same id, bumped epoch) and the idempotent one
    assert value(s, "semel_idempotent_producers_active") == 3
    assert timeout_pid >= 0
    assert value(s, "semel_requests_total", api="end_txn") == COMMITS + ABORTS
    assert value(s, "semel_request_seconds_count", api="end_txn") == COMMITS + ABORTS
    assert value(s, "semel_requests_total", api="produce") >= COMMITS + ABORTS + 1 + 1 + RESENDS
    assert value(s, "semel_bytes_in_total") > 0 and value(s, "semel_bytes_out_total") > 0
    for p, (hw, lso) in ends.items():
        labels = dict(topic=TOPIC, partition=str(p))
        assert value(s, "semel_partition_high_watermark", **labels) == hw
        assert value(s, "semel_partition_last_stable_offset", **labels) == lso == hw
        assert value(s, "semel_partition_lso_gap", **labels) == 0
        # a cluster of one: every partition led here, itself its only replica and ISR
        assert value(s, "semel_partition_isr_size", **labels) == value(s, "semel_partition_replicas", **labels) == 1
    assert value(s, "semel_under_replicated_partitions") == 0
    # the security layer's counters are declared (labelled: no sample until a login fails or a check denies)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "# TYPE semel_failed_logins_total counter" in text
    assert "# TYPE semel_authorization_denials_total counter" in text
    r = subprocess.run([sys.executable, "-m", "semel", "txn", "stats", "--bootstrap", metered.bootstrap,
                        "--metrics", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"Started: {COMMITS + ABORTS + 1}", f"Committed: {COMMITS}",
                                     f"Aborted: {ABORTS + 1}", "Timed out: 1", "Active: 0"]


def test_open_transaction_shows_in_active_and_lso_gap(metered):
    port = metered.metrics_port
    with Client(metered.bootstrap) as c:
        if TOPIC not in {t.name for t in c.metadata(None).topics}:
            assert c.create_topic(TOPIC, 2) == KafkaError.NONE
        t = RawTxn(c, "metered-open")
        assert t.init() == KafkaError.NONE
        t.add((TOPIC, 1))
        assert t.produce(TOPIC, 1, b"x", b"y")[0] == KafkaError.NONE
        s = scrape(port)
        labels = dict(topic=TOPIC, partition="1")
        assert value(s, "semel_transactions_active") == 1
        assert value(s, "semel_partition_lso_gap", **labels) == 2
        assert (value(s, "semel_partition_high_watermark", **labels)
                - value(s, "semel_partition_last_stable_offset", **labels)) == 2
        assert t.end(True) == KafkaError.NONE
        s = scrape(port)
        assert value(s, "semel_transactions_active") == 0
        assert value(s, "semel_partition_lso_gap", **labels) == 0

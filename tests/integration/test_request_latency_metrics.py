"""The per-API request latency histograms on the Prometheus endpoint: an idempotent
acks=all confluent-kafka producer writes to a real broker process (flush mode
"always", the default), and the scrape shows every Produce it answered, in the total
histogram and in each stage's, with buckets that add up."""
from __future__ import annotations

import urllib.request

from semel.broker.request_times import STAGES
from semel.client import Client
from semel.launch.process import free_port
from semel.protocol.errors import KafkaError

TOPIC = "timed"
RECORDS = 300


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _histogram(samples, name: str, **labels) -> tuple[list[tuple[float, float]], float, float]:
    """(sorted (le, cumulative count) buckets, count, sum) of one labelled histogram."""
    want = tuple(sorted(labels.items()))
    buckets = sorted((float(dict(k)["le"]), v) for (n, k), v in samples.items()
                     if n == f"{name}_bucket" and tuple(sorted((a, b) for a, b in k if a != "le")) == want)
    return buckets, samples.get((f"{name}_count", want), 0.0), samples.get((f"{name}_sum", want), 0.0)


def _check_buckets(buckets: list[tuple[float, float]], count: float) -> None:
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), f"cumulative buckets must not decrease: {buckets}"
    assert buckets[-1][0] == float("inf") and buckets[-1][1] == count


def _produce(bootstrap: str) -> None:
    from confluent_kafka import Producer
    delivered: list[object] = []
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 1})
    for i in range(RECORDS):
        p.produce(TOPIC, b"x" * 100, partition=i % 4, on_delivery=lambda err, msg: delivered.append(err))
        if i % 50 == 0:
            p.flush(30)   # several requests, not one batch
    assert p.flush(30) == 0
    assert delivered == [None] * RECORDS


def test_produce_latency_histograms_by_stage(start_broker):
    port = free_port()
    b = start_broker("--metrics-port", str(port))
    with Client(b.bootstrap) as c:
        assert c.create_topic(TOPIC, 4) == KafkaError.NONE
    before = _scrape(port)
    _produce(b.bootstrap)
    after = _scrape(port)
    requests = (after[("semel_requests_total", (("api", "produce"),))]
                - before.get(("semel_requests_total", (("api", "produce"),)), 0.0))
    assert requests >= RECORDS // 50
    buckets, count, total_s = _histogram(after, "semel_request_seconds", api="produce")
    _, count_before, _ = _histogram(before, "semel_request_seconds", api="produce")
    # every acks=all Produce is answered, and each answer is timed once
    assert count - count_before == requests
    _check_buckets(buckets, count)
    assert total_s > 0
    stage_sum = 0.0
    for stage in STAGES:
        s_buckets, s_count, s_sum = _histogram(after, "semel_request_stage_seconds", api="produce", stage=stage)
        assert s_count == count, stage
        _check_buckets(s_buckets, s_count)
        stage_sum += s_sum
    # the stages split the total: their sums add up to it
    assert abs(stage_sum - total_s) <= 1e-6 * max(1.0, total_s)
    # the Metadata and ApiVersions requests of the client are timed as well
    assert _histogram(after, "semel_request_seconds", api="metadata")[1] >= 1

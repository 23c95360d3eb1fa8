"""`semel console` in a real browser (Debian's chromium, headless, Playwright) against a
real 3-broker cluster: a killed broker shows as down on /brokers, the partitions it
led move to live leaders on /topics, and the console keeps answering throughout; an
open transaction shows the gap it holds on a replicated partition, read from the
partition's leader and the transaction's coordinator, wherever they are. The
brokers' Prometheus endpoints agree: the survivors report the shrunken ISRs and
count the partitions as under-replicated.
"""
from __future__ import annotations

import urllib.request

import pytest
from confluent_kafka import Producer
from playwright.sync_api import expect
from prometheus_client.parser import text_string_to_metric_families

from semel.launch.local_cluster import LocalCluster
from semel.launch.process import free_port
from tests.support.cluster import all_led, create_replicated, fill, partitions, wait_brokers
from tests.support.console import browser_page, console_process, screenshot
from tests.support.markers import starts_processes
from tests.support.wait import until

TOPIC = "orders"
PARTS = 3


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("console-cluster"), 3, lease_ttl_s=2)
    for b in c.brokers:   # each broker's Prometheus endpoint (the replication gauges)
        b.metrics_port = free_port()
        b.extra_args += ["--metrics-port", str(b.metrics_port)]
    try:
        c.start()
        wait_brokers(c, {0, 1, 2})
        create_replicated(c, [TOPIC], PARTS)
        until(lambda: all_led(c, [TOPIC], full_isr=True), "every partition led, all replicas in sync")
        fill(c, TOPIC, 30, PARTS)
        yield c
    finally:
        c.stop()
        c.close()


def _gauges(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {s.name + repr(sorted(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_open_transaction_on_a_replicated_partition(cluster, tmp_path):
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "cluster-copier"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(4):
        p.produce(TOPIC, f"open-{i}".encode(), partition=1)
    p.flush(30)
    with console_process(cluster.bootstrap, tmp_path / "console.log") as url, browser_page() as page:
        page.goto(f"{url}/transactions")
        row = page.locator("#txn-cluster-copier")
        expect(row).to_have_attribute("data-gap", "4")
        expect(row.locator(".holds")).to_contain_text(f"{TOPIC}-1: 4 records")
        page.goto(f"{url}/topics")
        expect(page.locator(f"#tp-{TOPIC}-1")).to_have_attribute("data-gap", "4")
    p.abort_transaction(30)


def test_killed_broker_shown_down_and_its_partitions_move(cluster, tmp_path):
    led = partitions(cluster, TOPIC)
    victim = led[0][0]
    moved = [p for p, (leader, *_rest) in led.items() if leader == victim]
    with console_process(cluster.bootstrap, tmp_path / "console.log") as url, browser_page() as page:
        page.goto(f"{url}/brokers")
        for n in range(3):
            expect(page.locator(f"#broker-{n}")).to_have_attribute("data-live", "yes")
        screenshot(page, tmp_path, "brokers-cluster")

        cluster.brokers[victim].kill()
        expect(page.locator(f"#broker-{victim}")).to_have_attribute("data-live", "no", timeout=30_000)
        expect(page.locator(f"#broker-{victim} .status")).to_contain_text("down")
        screenshot(page, tmp_path, "brokers-down")

        page.goto(f"{url}/topics")
        for p in moved:
            row = page.locator(f"#tp-{TOPIC}-{p}")
            expect(row).not_to_have_attribute("data-leader", str(victim), timeout=60_000)
            expect(row).not_to_have_attribute("data-leader", "-1", timeout=60_000)
        # Its replicas left the ISR: those partitions are highlighted as under-replicated.
        expect(page.locator(f"#tp-{TOPIC}-{moved[0]}")).to_have_class("warn", timeout=60_000)
        screenshot(page, tmp_path, "topics-cluster")

    # The brokers' Prometheus endpoints say the same: every partition of TOPIC is led by a
    # survivor with two replicas in sync of three, and counted as under-replicated there.
    live = [b for n, b in enumerate(cluster.brokers) if n != victim]
    scraped = [_gauges(b.metrics_port) for b in live]
    under = sum(g.get("semel_under_replicated_partitions[]", 0) for g in scraped)
    assert under >= PARTS, scraped
    for p in range(PARTS):
        key = f"[('partition', '{p}'), ('topic', '{TOPIC}')]"
        assert [g["semel_partition_isr_size" + key] for g in scraped if "semel_partition_isr_size" + key in g] == [2]
        assert [g["semel_partition_replicas" + key] for g in scraped if "semel_partition_replicas" + key in g] == [3]

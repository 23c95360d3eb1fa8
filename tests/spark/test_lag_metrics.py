"""semel.spark.metrics.LagListener on a real streaming query: after each batch the
offsets behind latest (Spark's Kafka source figures) are logged and served on a
Prometheus endpoint, and they go to zero as the query catches up."""
from __future__ import annotations

import logging
from contextlib import contextmanager
import urllib.request

from semel.launch.process import free_port
from semel.spark.metrics import LagListener, behind_latest
from tests.spark.test_source import create, produce
from tests.support import wait


def test_behind_latest_per_partition():
    assert behind_latest('{"t":{"0":10,"1":5}}', '{"t":{"0":50,"1":5,"2":9}}') == {("t", 0): 40, ("t", 1): 0}
    assert behind_latest('{"t":{"0":10}}', '{"t":{"0":3}}') == {("t", 0): 0}   # never below 0
    assert behind_latest('{"t":{"0":1}}', None) is None
    assert behind_latest('[1, 2]', '{"t":{"0":3}}') is None    # another source's offsets


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("semel_spark_")}


def test_lag_after_each_batch_in_log_and_prometheus(spark, spark_broker, tmp_path, caplog):
    bs = spark_broker.bootstrap
    create(bs, "lag-in", 2)
    produce(bs, "lag-in", [f"a{i}" for i in range(50)], partition=0)
    produce(bs, "lag-in", [f"b{i}" for i in range(50)], partition=1)
    port = free_port()
    listener = LagListener.install(spark, port=port, addr="127.0.0.1")
    seen = []
    record = listener.record
    listener.record = lambda progress: seen.append(record(progress)) or seen[-1]
    caplog.set_level(logging.INFO, logger="semel.spark.lag")
    try:
        # 100 offsets, 20 a batch, shared 10/10 over the two partitions: 40, 30, 20, 10, 0 behind
        q = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bs).option("subscribe", "lag-in")
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "20").load()
             .writeStream.format("noop").queryName("lagq").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
        q.awaitTermination(180)
        assert q.exception() is None
        wait.until(lambda: len([s for s in seen if s]) >= 5, "the listener saw the five batches")
        by_batch = {lag.batch: (lag.min, lag.max, lag.avg) for s in seen for lag in s}
        assert [by_batch[b] for b in range(5)] == [(40, 40, 40), (30, 30, 30), (20, 20, 20), (10, 10, 10), (0, 0, 0)]
        assert {lag.source for s in seen for lag in s} == {"semel:lag-in"}
        assert "query lagq batch 0 source semel:lag-in: offsets behind latest min 40 max 40 avg 40" in caplog.text
        wait.until(lambda: not scrape(port), "the ended query's series are removed")
    finally:
        spark.streams.removeListener(listener)
        listener.close()


@contextmanager
def caught_up_query(spark, bs: str, topic: str, name: str, tmp_path):
    """A running query over a 1-partition `topic` of 30 records, 10 a batch, with a
    LagListener on a free port; yields that port once the endpoint says it caught up,
    and stops the query and the listener after."""
    create(bs, topic, 1)
    produce(bs, topic, [f"r{i}" for i in range(30)])
    port = free_port()
    listener = LagListener.install(spark, port=port, addr="127.0.0.1")
    try:
        q = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bs).option("subscribe", topic)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "10").load()
             .writeStream.format("noop").queryName(name).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
        try:
            key = f'semel_spark_max_offsets_behind_latest{{query="{name}",source="semel:{topic}"}}'
            wait.until(lambda: scrape(port).get(key) == 0, "the running query caught up on the endpoint")
            yield port
        finally:
            q.stop()
        wait.until(lambda: not scrape(port), "the stopped query's series are removed")
    finally:
        spark.streams.removeListener(listener)
        listener.close()


def test_endpoint_serves_the_last_progress(spark, spark_broker, tmp_path):
    """While a query runs its series are on the endpoint; they go when it stops."""
    with caught_up_query(spark, spark_broker.bootstrap, "lag-run", "lagrun", tmp_path) as port:
        got = scrape(port)
        assert got['semel_spark_partition_offsets_behind_latest{partition="0",query="lagrun",topic="lag-run"}'] == 0
        assert got['semel_spark_avg_offsets_behind_latest{query="lagrun",source="semel:lag-run"}'] == 0


def test_console_shows_the_listener_queries(spark, spark_broker, tmp_path):
    """`semel console --spark-metrics` lists a running query from its lag listener, per
    source and per partition, in a real browser."""
    from playwright.sync_api import expect

    from tests.support.console import browser_page, console_process, screenshot
    bs = spark_broker.bootstrap
    with caught_up_query(spark, bs, "lag-console", "lagconsole", tmp_path) as port, \
            console_process(bs, tmp_path / "console.log", "--spark-metrics", f"127.0.0.1:{port}") as url, \
            browser_page() as page:
        page.goto(f"{url}/spark")
        section = page.locator("#query-lagconsole")
        expect(section).to_contain_text("semel:lag-console")
        expect(section.locator("tr", has_text="lag-console")).to_have_count(2)   # source and partition 0
        screenshot(page, tmp_path, "spark")

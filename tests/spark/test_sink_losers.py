"""Losing task attempts hold back no reader: after a batch's decision the sink aborts
every branch of it still open, whatever its attempt number, and every open branch of
an earlier batch (a copy killed after that batch was decided), by listing the query's
open branches on the parent's coordinator (ListTransactions with an id pattern).
Checked on a real semel broker in both sink modes with an unmodified confluent-kafka
read_committed reader: right after commit() returns, each output partition's last
stable offset is its high watermark (a dead attempt would hold it at its first row until
its transaction timeout), and only the winners' rows are visible."""
from __future__ import annotations

import pytest

from semel.client import Client
from semel.client import txn as wire
from semel.spark import branch_writer
from semel.spark import decision as spark_decision
from semel.spark import sink
from tests.spark.test_source import create
from tests.support.read_end import read_to_end
from tests.support.wait import until

COLS = {"value": 0}


def opts(bs: str, query: str, topic: str, mode: str):
    return sink.probe(sink.parse_options({"kafka.bootstrap.servers": bs, "semel.query.id": query, "topic": topic,
                                          "semel.atomicBatches": mode, "semel.restartWindowMs": "600000"}))


def stalled(bs: str, topic: str) -> bool:
    """Whether an open transaction holds the last stable offset below the high watermark."""
    with Client(bs) as c:
        return c.list_offset(topic, 0, -1, isolation=1) < c.list_offset(topic, 0, -1, isolation=0)


def write(o, batch: int, task: int, attempt: int, value: str):
    return branch_writer.write_branch(o, COLS, iter([(value.encode(),)]), batch, task, attempt, check=False)


@pytest.mark.parametrize("mode", ["true", "false"])
def test_a_killed_speculative_attempt_is_aborted_by_the_decision(spark_broker, mode):
    """Task 0's attempt 1 wins; its speculative copies 2 and 4 were killed mid-write
    (their branches open, with rows), beyond the attempt numbers a guess from the
    winner's would reach."""
    bs = spark_broker.bootstrap
    topic = f"lose-spec-{mode}"
    create(bs, topic, 1)
    o = opts(bs, f"ls{mode}", topic, mode)
    write(o, 0, 0, 2, "dead-2")
    write(o, 0, 0, 4, "dead-4")
    won = write(o, 0, 0, 1, "won")
    assert stalled(bs, topic)
    spark_decision.commit_batch(o, [won], 0)
    assert not stalled(bs, topic)
    assert read_to_end(bs, topic, 1) == ["won"]


@pytest.mark.parametrize("mode", ["true", "false"])
def test_a_copy_killed_after_the_decision_is_aborted_by_the_next_batch(spark_broker, mode):
    """A copy of batch 0 starts after batch 0 was decided and dies mid-write: the commit
    of batch 1 aborts it; a branch of batch 2 being written meanwhile is left alone."""
    bs = spark_broker.bootstrap
    topic = f"lose-late-{mode}"
    create(bs, topic, 1)
    o = opts(bs, f"ll{mode}", topic, mode)
    spark_decision.commit_batch(o, [write(o, 0, 0, 0, "b0")], 0)
    write(o, 0, 0, 7, "late-copy")
    assert stalled(bs, topic)
    b1 = write(o, 1, 0, 0, "b1")
    spark_decision.commit_batch(o, [b1], 1)
    b2 = write(o, 2, 0, 0, "b2")                 # the next batch, not decided yet
    assert stalled(bs, topic)                     # only b2 holds it now
    spark_decision.commit_batch(o, [b2], 2)
    assert not stalled(bs, topic)
    assert read_to_end(bs, topic, 1) == ["b0", "b1", "b2"]


def test_where_the_broker_cannot_list_the_guess_leaves_a_far_attempt_open(spark_broker, monkeypatch):
    """What the listing is for: with the attempt-number guess alone (a broker without
    ListTransactions by pattern), attempt 4 of a task whose winner is attempt 1 stays
    open after the decision and holds readers back until its timeout."""
    bs = spark_broker.bootstrap
    create(bs, "lose-guess", 1)
    o = opts(bs, "lg", "lose-guess", "true")
    monkeypatch.setattr(spark_decision, "_open_branches", lambda *a: None)
    write(o, 0, 0, 4, "dead-4")
    spark_decision.commit_batch(o, [write(o, 0, 0, 1, "won")], 0)
    assert stalled(bs, "lose-guess")
    with Client(bs) as c:                          # fenced by hand, as the listing would
        wire.init_producer_id(c, spark_decision.branch_id(o, 0, 0, 4), 60_000)
    until(lambda: not stalled(bs, "lose-guess"), "the far attempt aborted")
    assert read_to_end(bs, "lose-guess", 1) == ["won"]

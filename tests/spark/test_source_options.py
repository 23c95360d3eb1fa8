"""Source options and admission control, without Spark or a broker: parsing is
pure, and the split of maxOffsetsPerTrigger over partitions is checked by property."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semel.spark import options as opt
from semel.spark.source import share

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def parse(batch=False, **kw):
    return opt.parse_source({**BASE, **kw}, batch=batch)


def test_spark_kafka_names_and_defaults():
    o = parse(subscribe="a, b", startingOffsets='{"a":{"0":23,"1":-2}}', maxRecordsPerTrigger="10")
    assert o.subscription.topics == ("a", "b")
    assert o.starting == {"a": {0: 23, 1: -2}}
    assert o.max_offsets == 10  # the name for maxOffsetsPerTrigger
    assert o.read_committed and o.fail_on_data_loss and not o.include_headers
    # Stream default: latest; batch default: earliest (Spark's defaults).
    assert o.starting == parse(startingOffsets='{"a":{"0":23,"1":-2}}', subscribe="a").starting
    assert parse(subscribe="a").starting == "latest"
    assert parse(batch=True, subscribe="a").starting == "earliest"
    # Spark passes option names in any case.
    assert opt.parse_source({"KAFKA.BOOTSTRAP.SERVERS": "h:1", "Subscribe": "x",
                             "MAXOFFSETSPERTRIGGER": "5"}, batch=False).max_offsets == 5
    assert parse(subscribePattern="t-.*").subscription.matches("t-1")
    assert not parse(subscribePattern="t-.*").subscription.matches("xt-1")
    assert parse(assign='{"a":[1,0]}').subscription.assigned == (("a", 0), ("a", 1))
    assert parse(subscribe="a", maxTriggerDelay="30s", minOffsetsPerTrigger="3").max_trigger_delay_ms == 30_000


@pytest.mark.parametrize("options, batch, message", [
    ({"subscribe": "a", "startingOffset": "earliest"}, False, "unknown source option"),
    ({"subscribe": "a", "endingOffsets": "latest"}, False, "batch reads"),
    ({"subscribe": "a", "startingOffsets": "latest"}, True, "not allowed for batch"),
    ({"subscribe": "a", "startingOffsets": '{"a":{"0":-1}}'}, True, "not allowed for batch"),
    ({"subscribe": "a", "endingOffsets": '{"a":{"0":-2}}'}, True, "not allowed as an ending"),
    ({"subscribe": "a", "startingOffsets": '{"a":{"x":1}}'}, False, "not a partition"),
    ({"subscribe": "a", "startingOffsets": '{"a":{"0":-3}}'}, False, "not a partition"),
    ({"subscribe": "a", "startingOffsets": "committed"}, False, "kafka.group.id"),
    ({"subscribe": "a", "maxOffsetsPerTrigger": "ten"}, False, "must be an integer"),
    ({"subscribe": "a", "maxOffsetsPerTrigger": "5", "maxRecordsPerTrigger": "6"}, False, "disagree"),
    ({"subscribe": "a", "maxOffsetsPerTrigger": "5", "minOffsetsPerTrigger": "6"}, False, "larger"),
    ({"subscribe": "a", "maxTriggerDelay": "soon"}, False, "duration"),
    ({"subscribe": "a", "failOnDataLoss": "maybe"}, False, "true or false"),
    ({"subscribePattern": "a(("}, False, "not a valid regex"),
    ({"assign": '{"a":["x"]}'}, False, "list of integers"),
    ({}, False, "exactly one of"),
])
def test_malformed_options(options, batch, message):
    with pytest.raises(opt.OptionError, match=message):
        parse(batch=batch, **options)


def test_bootstrap_required_and_well_formed():
    with pytest.raises(opt.OptionError, match="is required"):
        opt.parse_source({"subscribe": "a"}, batch=False)
    with pytest.raises(opt.OptionError, match="HOST:PORT"):
        opt.parse_source({"kafka.bootstrap.servers": "nohost", "subscribe": "a"}, batch=False)


def test_query_group_id_is_shared_by_source_and_sink():
    assert opt.query_group_id({"kafka.group.id": "g"}) == "g"
    a = opt.query_group_id({"checkpointLocation": "/ckpt/q1"})
    assert a == opt.query_group_id({"checkpointlocation": "/ckpt/q1/"})
    assert a != opt.query_group_id({"checkpointLocation": "/ckpt/q2"})
    assert opt.query_group_id({}) is None
    o = parse(subscribe="a", startingOffsets="committed", checkpointLocation="/ckpt/q1")
    assert o.group_id == a
    # The sink accepts the shared names too.
    assert opt.validate_sink({**BASE, "topic": "out", "checkpointLocation": "/c"})["topic"] == "out"
    with pytest.raises(opt.OptionError, match="unknown sink option"):
        opt.validate_sink({**BASE, "topik": "out"})


lags = st.dictionaries(st.tuples(st.sampled_from("abc"), st.integers(0, 7)),
                       st.integers(0, 10_000), min_size=1, max_size=12)


@given(lags, st.integers(1, 20_000))
def test_share_respects_cap_and_lag(lag, cap):
    got = share(lag, cap)
    assert set(got) == set(lag)
    assert all(0 <= got[tp] <= lag[tp] for tp in lag)
    # Uses the whole allowance (or everything there is): a capped batch always progresses.
    assert sum(got.values()) == min(cap, sum(lag.values()))


def admitter(**kw):
    """A stream reader's admission control without its broker connection."""
    from semel.spark.source import SemelStreamReader
    r = object.__new__(SemelStreamReader)
    r.opts = parse(subscribe="a", **kw)
    r._target = None
    r._last_batch = 0.0 if kw.get("maxTriggerDelay") == "0ms" else float("inf")
    return r


def test_admission_control_min_max_and_trigger_delay():
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows
    starts = {("a", 0): 10, ("a", 1): 0}
    latest = {("a", 0): 40, ("a", 1): 10}
    capped = admitter(maxOffsetsPerTrigger="20")
    assert capped._admit(starts, latest, ReadMaxRows(20)) == {("a", 0): 25, ("a", 1): 5}
    # ReadAllAvailable (Trigger.Once, or the engine's choice) ignores the options.
    assert capped._admit(starts, latest, ReadAllAvailable()) == latest
    waiting = admitter(minOffsetsPerTrigger="100")
    assert waiting._admit(starts, latest, ReadMinRows(100)) == starts
    waiting._target = latest  # Trigger.AvailableNow never waits for more
    assert waiting._admit(starts, latest, ReadMinRows(100)) == latest
    due = admitter(minOffsetsPerTrigger="100", maxTriggerDelay="0ms")
    assert due._admit(starts, latest, ReadMinRows(100)) == latest


def test_journaled_offsets_round_trip():
    from semel.spark.source import offsets_from_json, offsets_to_json
    offsets = {("a", 0): 5, ("a", 10): 0, ("b", 2): 7}
    journaled = offsets_to_json(offsets)
    assert journaled == {"a": {"0": 5, "10": 0}, "b": {"2": 7}}
    import json
    assert offsets_from_json(journaled) == offsets_from_json(json.dumps(journaled)) == offsets


ranges = st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 500)), min_size=0, max_size=6).map(
    lambda xs: [(("t", i), lo, lo + n) for i, (lo, n) in enumerate(xs) if n > 0])


@given(ranges, st.one_of(st.none(), st.integers(1, 40)), st.one_of(st.none(), st.integers(1, 600)))
def test_min_partitions_split_covers_every_offset_once(rs, at_least, at_most):
    """minPartitions and maxRecordsPerPartition: every offset read once, no empty
    task, at least `at_least` tasks (where there are offsets enough), none longer than
    `at_most`."""
    from semel.spark.source import split
    got = split(rs, at_least, at_most)
    covered = sorted((tp, o) for tp, lo, hi in got for o in range(lo, hi))
    assert covered == sorted((tp, o) for tp, lo, hi in rs for o in range(lo, hi))
    assert all(hi > lo for _, lo, hi in got)
    total = sum(hi - lo for _, lo, hi in rs)
    assert len(got) >= min(at_least or 0, total) and len(got) >= len(rs)
    if at_most is not None:
        assert all(hi - lo <= at_most for _, lo, hi in got)

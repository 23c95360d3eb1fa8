"""Mode (a) of the semel sink: atomic micro-batches through the broker's branch
extension (semel/coordinator/txn.py), against real semel/Tansu brokers and local
Spark, read back by an independent confluent-kafka read_committed consumer."""
from __future__ import annotations

import json
import threading
import time

import pytest

from semel.client import Client, admin
from semel.protocol.errors import KafkaError
from semel.spark import sink
from semel.spark import branch_writer
from semel.spark import decision as spark_decision
from semel.spark import routing
from semel.spark import sink_options
from tests.spark.test_source import create, produce
from tests.support.consume import read_values


def opts(bs: str, query: str, topic: str, mode: str) -> sink_options.SinkOptions:
    return sink.probe(sink.parse_options({"kafka.bootstrap.servers": bs, "semel.query.id": query, "topic": topic,
                                          "semel.atomicBatches": mode}))


def two_branches(o: sink_options.SinkOptions, batch: int) -> list[spark_decision.BranchMessage]:
    cols = {"value": 0, "partition": 1}
    return [branch_writer.write_branch(o, cols, iter([(f"p{p}-{i}".encode(), p) for i in range(3)]), batch, p, 0)
            for p in (0, 1)]


def test_probe_resolves_the_mode(spark_broker):
    bs = spark_broker.bootstrap
    create(bs, "am-probe", 1)
    assert opts(bs, "amp", "am-probe", "auto").atomic
    assert opts(bs, "amp", "am-probe", "true").atomic
    assert not opts(bs, "amp", "am-probe", "false").atomic


@pytest.mark.parametrize("mode", ["true", "false"])
def test_decision_alone_makes_the_whole_batch_visible_only_in_mode_a(spark_broker, monkeypatch, mode):
    """The driver dies right after the parent's EndTxn (the decision), before any
    branch EndTxn: in mode (a) the decision already committed every branch at once;
    in mode (b) nothing is visible until the next commit() rolls forward."""
    bs = spark_broker.bootstrap
    topic = f"am-dec-{mode}"
    create(bs, topic, 2)
    o = opts(bs, f"amd{mode}", topic, mode)
    msgs = two_branches(o, 0)
    with monkeypatch.context() as m:
        m.setattr(spark_decision, "end_branch", lambda *a: None)     # the crash: no branch is ended by the driver
        m.setattr(spark_decision, "fence_losers", lambda *a: None)
        spark_decision.commit_batch(o, msgs, 0)
    want = sorted(f"p{p}-{i}" for p in (0, 1) for i in range(3))
    if mode == "true":
        assert sorted(read_values(bs, topic, 2, want=6)) == want
    else:
        assert read_values(bs, topic, 2, idle_s=0.5) == []
        spark_decision.commit_batch(o, msgs, 0)   # Spark's replayed commit() of the decided batch rolls forward
        assert sorted(read_values(bs, topic, 2, want=6)) == want


def test_undecided_batch_is_aborted_whole_when_a_task_reruns(spark_broker):
    """A crash after the join, before the decision: the re-run task (same branch id)
    aborts the parent and every joined branch; only the re-run's rows get committed."""
    bs = spark_broker.bootstrap
    create(bs, "am-rerun", 2)
    o = opts(bs, "amr", "am-rerun", "true")
    first = two_branches(o, 0)
    with routing.connect(o) as r:
        st = routing.init_transaction(r, o, o.parent)
        spark_decision.join_branches(r, o, st, [spark_decision.branch_id(o, 0, m.partition, m.attempt) for m in first])
    again = two_branches(o, 0)   # Spark replays batch 0 after the restart: attempt numbers start at 0 again
    spark_decision.commit_batch(o, again, 0)
    assert sorted(read_values(bs, "am-rerun", 2, want=6)) == sorted(f"p{p}-{i}" for p in (0, 1) for i in range(3))


def test_losing_attempts_are_fenced_in_mode_a(spark_broker):
    """Attempt 0 wrote and lost to attempt 1 (a retry), attempt 2 never ran: commit() finds
    the attempts the broker knows (DescribeTransactions) and fences them; nothing stays
    open (the last stable offset reaches the log end) and only the winner is visible."""
    bs = spark_broker.bootstrap
    create(bs, "am-lose", 1)
    o = opts(bs, "aml", "am-lose", "true")
    branch_writer.write_branch(o, {"value": 0}, iter([(b"lost",)]), 0, 0, 0)
    win = branch_writer.write_branch(o, {"value": 0}, iter([(b"won",)]), 0, 0, 1)
    spark_decision.commit_batch(o, [win], 0)
    assert read_values(bs, "am-lose", 1, want=1) == ["won"]
    with Client(bs) as c:
        assert c.list_offset("am-lose", 0, -1, isolation=1) == c.list_offset("am-lose", 0, -1, isolation=0)
        described = {d.transactional_id: d.error for d in admin.describe_transactions(
            c, [spark_decision.branch_id(o, 0, 0, a) for a in range(3)])}
    assert described[spark_decision.branch_id(o, 0, 0, 2)] == KafkaError.TRANSACTIONAL_ID_NOT_FOUND  # not created by a fence


def test_batch_write_in_mode_a(spark, spark_broker):
    bs = spark_broker.bootstrap
    create(bs, "am-bw", 2)
    df = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(30)], "key string, value string").repartition(3)
    (df.write.mode("append").format("semel").option("kafka.bootstrap.servers", bs).option("topic", "am-bw")
     .option("semel.atomicBatches", "true").save())
    assert sorted(read_values(bs, "am-bw", 2, want=30)) == sorted(f"v{i}" for i in range(30))


def test_atomic_true_on_a_broker_without_the_extension_refuses_to_start(tansu):
    create(tansu.bootstrap, "am-tansu", 1)
    with pytest.raises(sink_options.SinkError, match="does not support atomic batches"):
        opts(tansu.bootstrap, "amt", "am-tansu", "true")
    assert not opts(tansu.bootstrap, "amt", "am-tansu", "auto").atomic


@pytest.mark.parametrize("mode", ["true", "false"])
def test_a_batch_of_many_tasks(spark_broker, mode):
    """300 writing tasks: mode (a) records no branch list (the parent holds them on the
    broker) and commits all; mode (b) cannot fit them into 4 KB of offset metadata and
    says so, before any decision (nothing visible)."""
    bs = spark_broker.bootstrap
    topic = f"am-many-{mode}"
    create(bs, topic, 1)
    o = opts(bs, f"amm{mode}", topic, mode)
    msgs = [branch_writer.write_branch(o, {"value": 0}, iter([(f"t{p}".encode(),)]), 0, p, 0) for p in range(300)]
    if mode == "true":
        spark_decision.commit_batch(o, msgs, 0)
        assert sorted(read_values(bs, topic, 1, want=300)) == sorted(f"t{p}" for p in range(300))
    else:
        with pytest.raises(sink_options.SinkError, match="too many to record"):
            spark_decision.commit_batch(o, msgs, 0)
        spark_decision.abort_batch(o, msgs, 0)
        assert read_values(bs, topic, 1, idle_s=0.5) == []


def test_the_decision_does_not_grow_with_the_task_count(spark_broker):
    """Batches of 10, 200 and 2,000 writing tasks commit in mode (a) on a broker holding
    Kafka's default offset.metadata.max.bytes (4096, shown by an unmodified client's
    commit of 4,097 bytes being refused); the decision's metadata is the same size for
    all three, and a read_committed reader gets every task's row once."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    from semel.client import txn as wire
    bs = spark_broker.bootstrap
    create(bs, "am-size", 1)
    c = Consumer({"bootstrap.servers": bs, "group.id": "am-size-limit", "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition("am-size", 0, 1, "x" * 4097)], asynchronous=False)
        raise AssertionError("4097 bytes of offset metadata were accepted")
    except KafkaException as exc:
        assert exc.args[0].name() == "OFFSET_METADATA_TOO_LARGE"
    finally:
        c.close()
    o = opts(bs, "amsize", "am-size", "true")
    sizes, want = [], []
    for batch, tasks in enumerate((10, 200, 2000)):
        msgs = [branch_writer.write_branch(o, {"value": 0}, iter([(f"b{batch}t{p}".encode(),)]), batch, p, 0)
                for p in range(tasks)]
        spark_decision.commit_batch(o, msgs, batch)
        with Client(bs) as cl:
            (_, meta), = wire.committed_with_metadata(cl, o.group, [("am-size", 0)]).values()
        assert json.loads(meta)["batch"] == batch
        sizes.append(len(meta) - len(str(batch)))
        want += [f"b{batch}t{p}" for p in range(tasks)]
    assert sizes[0] == sizes[1] == sizes[2] < 200, sizes
    assert sorted(read_values(bs, "am-size", 1, want=len(want))) == sorted(want)


@pytest.mark.parametrize("mode", ["true", "false"])
def test_tasks_that_wrote_nothing(spark, spark_broker, mode):
    """An empty partition's task leaves an empty branch (no transaction): the batch
    still commits in both modes, streaming and batch."""
    bs = spark_broker.bootstrap
    topic = f"am-empty-{mode}"
    create(bs, topic, 1)
    o = opts(bs, f"ame{mode}", topic, mode)
    full = branch_writer.write_branch(o, {"value": 0}, iter([(b"x",)]), 0, 0, 0)
    empty = branch_writer.write_branch(o, {"value": 0}, iter([]), 0, 1, 0)
    spark_decision.commit_batch(o, [full, empty], 0)
    assert read_values(bs, topic, 1, want=1) == ["x"]
    df = spark.createDataFrame([("v",)], "value string").repartition(3)   # two of three tasks empty
    (df.write.mode("append").format("semel").option("kafka.bootstrap.servers", bs).option("topic", topic)
     .option("semel.atomicBatches", mode).save())
    assert sorted(read_values(bs, topic, 1, want=2)) == ["v", "x"]


# --- a live read_committed reader against a streaming query in mode (a) ---------------------

def partial_batches(observed, expected: dict[int, set], partitions: int) -> list[str]:
    """What a reader's history shows of batches seen in part; [] when none.

    observed: (partition, batch, row) in the order the reader received them. The
    reader has "read past" batch B in partition q once it has read a row of a later
    batch there (batches are written one after another, so in every partition a
    later batch's rows lie behind B's). Once it has read past B in every partition it
    must hold exactly B's expected rows (expected: batch -> row ids, from the input).
    A row of B arriving after a later batch's row in the same partition is a part of
    B made visible late. Duplicates are reported too."""
    problems: list[str] = []
    last = [-1] * partitions        # newest batch read per partition
    seen: dict[int, set] = {}
    checked = -1                    # batches up to this one were complete when read past
    for q, b, row in observed:
        if b < last[q]:
            problems.append(f"row {row} of batch {b} in partition {q} after batch {last[q]}")
        last[q] = max(last[q], b)
        if row in seen.setdefault(b, set()):
            problems.append(f"row {row} of batch {b} read twice")
        seen[b].add(row)
        while checked + 1 < min(last):  # read past batch checked+1 in every partition
            checked += 1
            missing = expected.get(checked, set()) - seen.get(checked, set())
            if missing:
                problems.append(f"batch {checked} read past in every partition without {len(missing)} of its "
                                f"rows, e.g. {sorted(missing)[:3]}")
    return problems


def test_partial_batches_finds_what_per_partition_atomicity_shows():
    """The checker used below can fail. Were a batch decided partition by partition
    (or task by task, as mode b commits its branches one EndTxn at a time), a part
    could be lost while the rest commits: the driver dies between two parts' commits
    and the open part is aborted by its timeout. The next batch then commits in every
    partition, the reader reads past the first one everywhere, and lacks that part.
    Or the part is committed late, after the reader already saw the next batch there."""
    expected = {0: {"a", "b", "c"}, 1: {"d", "e"}}
    lost = [(0, 0, "a"), (0, 0, "b"), (0, 1, "d"), (1, 1, "e")]          # batch 0's part in p1 ("c") aborted
    assert partial_batches(lost, expected, 2) == \
        ["batch 0 read past in every partition without 1 of its rows, e.g. ['c']"]
    late = [(0, 0, "a"), (0, 0, "b"), (1, 1, "e"), (0, 1, "d"), (1, 0, "c")]  # "c" decided after batch 1
    assert partial_batches(late, expected, 2) == [
        "batch 0 read past in every partition without 1 of its rows, e.g. ['c']",
        "row c of batch 0 in partition 1 after batch 1"]
    whole = [(1, 0, "c"), (0, 0, "a"), (0, 0, "b"), (0, 1, "d"), (1, 1, "e")]
    assert partial_batches(whole, expected, 2) == []
    assert partial_batches(whole + [(1, 1, "e")], expected, 2) == ["row e of batch 1 read twice"]


class LiveReader(threading.Thread):
    """An unmodified confluent-kafka read_committed consumer polling a topic from offset
    0 until stopped: the history of (partition, value, monotonic time) it received."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        super().__init__(daemon=True)
        from confluent_kafka import Consumer, TopicPartition
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "live-reader",
                                  "isolation.level": "read_committed", "enable.auto.commit": False,
                                  "fetch.wait.max.ms": 10})
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.history: list[tuple[int, str, float]] = []
        self.done = threading.Event()
        self.want = None

    def run(self) -> None:
        try:
            while not (self.done.is_set() and len(self.history) >= self.want):
                m = self.consumer.poll(0.05)
                if m is not None and not m.error():
                    self.history.append((m.partition(), m.value().decode(), time.monotonic()))
        finally:
            self.consumer.close()

    def finish(self, want: int, timeout_s: float = 60) -> None:
        self.want = want
        self.done.set()
        self.join(timeout_s)


def test_live_reader_never_sees_part_of_a_batch(spark, spark_broker, tmp_path):
    """A streaming query in mode (a): 3 tasks per micro-batch, each writing to all 3
    output partitions (rows are spread by key), 10 micro-batches; a read_committed
    reader polls all the while. Each output row names its input (partition:offset),
    and Spark's offset log says which batch read that input, so every row the reader
    got is tagged with its batch. The reader never holds part of a batch once it has
    read past it everywhere, never gets a row late or twice, and ends with every row."""
    bs = spark_broker.bootstrap
    create(bs, "ar-in", 3)
    create(bs, "ar-out", 3)
    per_partition = 400
    for p in range(3):
        produce(bs, "ar-in", [str(i) for i in range(per_partition)], partition=p)
    ck = tmp_path / "ck"
    reader = LiveReader(bs, "ar-out", 3)
    reader.start()
    q = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bs).option("subscribe", "ar-in")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "120").load()
         .selectExpr("concat(partition, ':', offset) as key", "concat(partition, ':', offset) as value")
         .writeStream.format("semel").option("kafka.bootstrap.servers", bs).option("topic", "ar-out")
         .option("semel.atomicBatches", "true").option("checkpointLocation", str(ck))
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    ended = time.monotonic()
    assert q.exception() is None
    total = 3 * per_partition
    reader.finish(total)
    assert len(reader.history) == total, "the reader did not get every row"
    # the reader was reading while the query wrote, not only afterwards
    assert sum(t < ended for _, _, t in reader.history) > total // 2

    o = sink.parse_options({"kafka.bootstrap.servers": bs, "checkpointLocation": str(ck)})
    ends = {}
    batch = 0
    while offsets := spark_decision.batch_offsets(o, batch):
        ends[batch] = offsets
        batch += 1
    assert len(ends) >= 10

    def batch_of(row: str) -> int:
        p, off = map(int, row.split(":"))
        return min(b for b, e in ends.items() if e[("ar-in", p)] > off)
    expected: dict[int, set] = {}
    for p in range(3):
        for off in range(per_partition):
            expected.setdefault(batch_of(f"{p}:{off}"), set()).add(f"{p}:{off}")
    observed = [(q_, batch_of(v), v) for q_, v, _ in reader.history]
    assert partial_batches(observed, expected, 3) == []
    # every batch wrote to every output partition, so each one but the last was checked when read past
    assert all(len({q_ for q_, b, _ in observed if b == n}) == 3 for n in expected)

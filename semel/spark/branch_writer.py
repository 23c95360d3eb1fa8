"""A task's branch transaction: InitProducerId (after the decided-yet check), its
rows partitioned as Kafka's producer does and produced as transactional batches, and
the re-check that the batch was not decided meanwhile.
"""
from __future__ import annotations

import itertools

import os
import time
from typing import Iterator, TypeVar

from semel.client.client import Client, ClientError
from semel.client import txn as wire
from semel.client.cluster import TRANSACTION, ClusterRouter
from semel.protocol.errors import KafkaError
from semel.spark import batches
from semel.spark.decision import BranchMessage, branch_id, decision_partitions, is_decided, is_decided_call
from semel.spark.hooks import FAIL_FIRST_ATTEMPT_ENV, kill_if
from semel.spark.routing import (BROKEN, connect, end_transaction, group_coordinator, init_transaction, partition_leader,
                                 reset_connections, retry_rounds, retrying, route_key, txn_coordinator)
from semel.spark.sink_options import MAX_REQUEST_BYTES, TP, SinkError, SinkOptions
from semel.spark.trace import Phases

def _bytes(v) -> bytes | None:
    if v is None:
        return None
    return v.encode() if isinstance(v, str) else bytes(v)


def _header(h) -> tuple:
    # a Row (key, value) from the row path, a {"key", "value"} dict from Arrow's to_pylist
    k, v = (h["key"], h["value"]) if isinstance(h, dict) else (h[0], h[1])
    return k, _bytes(v)

class Partitioner:
    """Kafka's default choice: explicit partition, else murmur2 of the key, else round robin."""

    def __init__(self, r: ClusterRouter, start: int):
        self.r = r
        self.sizes: dict[str, int] = {}
        self.next = start
        self.hashes: dict[bytes, int] = {}  # murmur2 per key: keys repeat, the hash is pure Python

    def count(self, topic: str) -> int:
        n = self.sizes.get(topic)
        if n is None:
            try:
                n = self.sizes[topic] = self.r.partition_count(topic)
            except ClientError as exc:
                raise SinkError(f"semel sink: {exc}") from None
        return n

    def pick(self, topic: str, key: bytes | None, partition) -> int:
        n = self.count(topic)
        if partition is not None:
            if not 0 <= int(partition) < n:
                raise SinkError(f"semel sink: partition {partition} out of range for topic {topic} ({n})")
            return int(partition)
        if key is not None:
            h = self.hashes.get(key)
            if h is None:
                self._hash([key])
                h = self.hashes[key]
            return h % n
        self.next += 1
        return self.next % n

    def pick_many(self, topic: str, keys, rows: int):
        """pick() for `rows` rows at once, as a NumPy array, with the same choices: murmur2
        of each key (`keys`: an Arrow binary or string column without nulls), or round
        robin where there is no key column (None). Each distinct key is hashed once."""
        import numpy as np
        import pyarrow as pa
        n = self.count(topic)
        if keys is None:
            parts = (self.next + 1 + np.arange(rows, dtype=np.int64)) % n
            self.next += rows
            return parts
        enc = keys.dictionary_encode()
        distinct = enc.dictionary.cast(pa.binary()).to_pylist()
        self._hash(distinct)
        hashes = np.fromiter(map(self.hashes.__getitem__, distinct), dtype=np.int64, count=len(distinct))
        return hashes[batches.ints(enc.indices)] % n   # indices: no nulls (keys have none here)

    def _hash(self, keys) -> None:
        """Cache murmur2 of the keys not cached yet."""
        from kafka.partitioner.default import murmur2
        if len(self.hashes) > 100_000:
            self.hashes.clear()
        for key in set(keys).difference(self.hashes):
            self.hashes[key] = murmur2(key) & 0x7FFFFFFF

def arrow_rows(batches: Iterator, cols: dict[str, int]) -> Iterator[tuple]:
    """Rows as tuples in schema order from Arrow record batches, converted a column at a
    time (Spark's own Row path converts value by value and builds a Row per record)."""
    import pyarrow as pa
    for rb in batches:
        columns = []
        for i, col in enumerate(rb.columns):
            if i in (cols.get("key"), cols.get("value")):
                if pa.types.is_string(col.type):
                    col = col.cast(pa.binary())  # bytes straight from Arrow, no str round trip
                # bytes objects via NumPy: about ten times faster than to_pylist's scalars
                columns.append(col.to_numpy(zero_copy_only=False).tolist())
            else:
                columns.append(col.to_pylist())
        yield from zip(*columns)


class ArrowInput:
    """A task's input as Arrow record batches (what Spark's Arrow writers get): written a
    column at a time where the batch allows it (see _feed_arrow; columnar=False: always
    row by row, the reference the columnar path is tested against)."""

    def __init__(self, batches: Iterator, columnar: bool = True):
        self.batches = batches
        self.columnar = columnar


T = TypeVar("T")


def _with_last(items: Iterator[T]) -> Iterator[tuple[T, bool]]:
    """(item, whether it is the last), one item ahead of its consumer."""
    it = iter(items)
    for prev in it:
        for item in it:
            yield prev, False
            prev = item
        yield prev, True


def _feed_arrow(producer: "_BranchProducer", part: "Partitioner", cols: dict[str, int], data: ArrowInput,
                topic: str | None) -> None:
    """Each Arrow batch's rows are sent once the next batch has come (Spark's JVM keeps
    preparing the ones after it meanwhile), so little is left to send once the input
    ends (the task's tail, on the batch's critical path). The last batch's rows are left
    for write_branch's final flush, which sends the re-check in the same write: a task
    of one Arrow batch (up to 10,000 rows) takes two round trips, not three.

    The common case goes without a Python loop per row: one output topic (the option),
    keys without nulls or no key column, no partition or headers column. Rows are assigned
    and grouped per partition with NumPy, keeping their order within a partition, and their
    record batches are encoded from the Arrow buffers (semel.spark.batches); other batches
    take the row path. Either way the same rows go to the same partitions in the same order
    and produce requests are cut at the same rows."""
    import numpy as np
    ki, vi = cols.get("key"), cols["value"]
    # The topic option overrides a topic column (Spark's rule), so that column does not matter then.
    columnar = data.columnar and topic is not None and not {"partition", "headers"} & cols.keys()
    for rb, last in _with_last(data.batches):
        if not columnar or rb.num_rows == 0 or (ki is not None and rb.column(ki).null_count):
            _feed(producer, part, cols, arrow_rows([rb], cols), topic)
            if not last:
                producer.flush_lingering()
            continue
        values = batches.BinaryColumn(rb.column(vi))
        sizes = values.sizes() + 16  # what add() counts: key + value bytes + 16
        keys = None
        if ki is not None:
            keys = batches.BinaryColumn(rb.column(ki))
            sizes += keys.sizes()
        parts = part.pick_many(topic, rb.column(ki) if ki is not None else None, rb.num_rows)
        for p in np.unique(parts).tolist():
            idx = np.flatnonzero(parts == p)
            producer.add_columns(topic, p, keys, values, idx, sizes[idx])
        if not last:
            producer.flush_lingering()


def write_branch(o: SinkOptions, cols: dict[str, int], rows: Iterator, batch: int, partition: int,
                 attempt: int, check: bool = True, parts: list[TP] | None = None) -> BranchMessage:
    """One task attempt's branch. `parts`: where the batch's decision is recorded (from
    the writer's plan; without one, the `topic` option's partition 0)."""
    ph = Phases(o, f"write p{partition} a{attempt}", batch)
    if isinstance(rows, ArrowInput):
        rows = ArrowInput(ph.waited(rows.batches), rows.columnar)
    rows = _unless_empty(rows)
    if rows is None:
        # Nothing to write (most of an aggregation's 200 shuffle partitions in a small
        # batch): no branch, no broker round trip; commit() finds no branch to decide.
        ph.done(rows=0)
        return BranchMessage(partition, attempt)
    bid = branch_id(o, batch, partition, attempt)
    if check and parts is None:
        parts = decision_partitions(o, {})
    with connect(o) as r:
        ph.mark("connect")
        decided, st = _check_and_init(r, o, batch, bid, check, parts)
        ph.mark("check_and_init")
        if decided:
            return BranchMessage(partition, attempt, skipped=True)
        producer = _BranchProducer(o, r, st)
        part = Partitioner(r, partition)
        _feed(producer, part, cols, rows, o.topic)
        # The re-check rides with the last Produce request (the broker answers it after that
        # request): no round trip of its own unless nothing was left to send.
        recheck = producer.flush((lambda: group_coordinator(r, o), is_decided_call(o, batch, parts)) if check else None)
        ph.mark("input_and_produce")
        kill_if("write:produced", batch)
        if check and recheck is None:
            recheck = is_decided(r, o, batch, parts)
        ph.mark("recheck")
        ph.done(rows=producer.total, produce_ms=round(producer.send_s * 1000, 2))
        if recheck:
            # Decided while we wrote (a speculative copy or a zombie run lost the
            # race): commit() fenced only the attempt numbers it knew of, so end
            # our own branch now rather than leave it open for the restart window.
            retrying(o, "EndTxn", lambda: end_transaction(r, o, bid, st.pid, st.epoch, False))
            return BranchMessage(partition, attempt, skipped=True)
        if attempt == 0 and os.environ.get(FAIL_FIRST_ATTEMPT_ENV):
            raise SinkError("semel sink: injected failure of a first task attempt (test hook)")
        return BranchMessage(partition, attempt, st.pid, st.epoch, producer.total,
                             counts={f"{t}:{p}": n for (t, p), n in producer.counts.items()})


def _unless_empty(rows):
    """The same input, or None when it holds no row (only what it takes to see that is read)."""
    if isinstance(rows, ArrowInput):
        rest = iter(rows.batches)
        for first in rest:
            if first.num_rows:
                return ArrowInput(itertools.chain([first], rest), rows.columnar)
        return None
    rows = iter(rows)
    for first in rows:
        return itertools.chain([first], rows)
    return None


def _check_and_init(r: ClusterRouter, o: SinkOptions, batch: int, bid: str, check: bool, parts: list[TP] | None):
    """(decided already?, the branch's TxnState). A replay of a decided batch writes
    nothing. In mode (b) it must not InitProducerId its recorded branches either (that
    would abort them before commit() rolls them forward), so the check goes first. In
    mode (a) the broker completed a decided batch's branches itself and an InitProducerId
    of one changes nothing of it (of a branch of an undecided parent it aborts that parent,
    wanted either way): where the group's and the branch's coordinator are one broker, the
    check and the InitProducerId go in one write."""
    if not check:
        return False, init_transaction(r, o, bid)
    g = group_coordinator(r, o)
    if not o.atomic or g is not txn_coordinator(r, o, bid):
        if is_decided(r, o, batch, parts):
            return True, None
        return False, init_transaction(r, o, bid)
    try:
        decided, (err, st) = wire.pipelined(g, is_decided_call(o, batch, parts),
                                            (wire.init_producer_id_call(bid, o.restart_window_ms),
                                             wire.init_producer_id_result(bid)))
    except BROKEN:
        reset_connections(r)   # both again one at a time, each with its retries
        decided, err, st = None, KafkaError.NETWORK_EXCEPTION, None
    if decided is None:
        decided = is_decided(r, o, batch, parts)
    if decided:
        return True, None
    if err != KafkaError.NONE:
        st = init_transaction(r, o, bid)  # retried as on its own (CONCURRENT_TRANSACTIONS while the broker ends one)
    return False, st


def _feed(producer: "_BranchProducer", part: Partitioner, cols: dict[str, int], rows,
          topic: str | None) -> None:
    if isinstance(rows, ArrowInput):
        _feed_arrow(producer, part, cols, rows, topic)
        return
    ki, vi, ti, pi, hi = (cols.get(c) for c in ("key", "value", "topic", "partition", "headers"))
    for row in rows:
        # Spark's rule: the topic option, when set, wins over the row's topic column.
        t = topic if topic is not None or ti is None else row[ti]
        if t is None:
            raise SinkError("semel sink: a row has a null topic; set option 'topic' for a default topic")
        key = _bytes(row[ki]) if ki is not None else None
        value = row[vi]
        if value is not None and not isinstance(value, bytes):
            value = _bytes(value)
        headers = [_header(h) for h in (row[hi] or [])] if hi is not None else []
        producer.add(t, part.pick(t, key, row[pi] if pi is not None else None), (key, value, headers))


class _Chunk:
    """Records of one partition that go out as one record batch: rows (the row path,
    with headers) or row indices into Arrow columns (the columnar path)."""
    __slots__ = ("rows", "keys", "values", "idx", "count", "nbytes", "encoded")

    def __init__(self, nbytes: int, rows=None, keys=None, values=None, idx=None):
        self.rows, self.keys, self.values, self.idx = rows, keys, values, idx
        self.count = len(rows) if rows is not None else len(idx)
        self.nbytes = nbytes
        self.encoded: tuple | None = None

    def encode(self, st: wire.TxnState, seq: int, compression: int = 0) -> bytes:
        """The record batch; a resend (after a leader moved) is the same bytes, same
        producer id, epoch and sequence, so a broker that got it before drops the copy."""
        key = (st.pid, st.epoch, seq)
        if self.encoded is None or self.encoded[0] != key:
            if self.rows is not None:
                data = wire.build_txn_batch(self.rows, st.pid, st.epoch, seq, compression=compression)
            else:
                data = batches.encode(self.keys, self.values, self.idx, producer_id=st.pid, producer_epoch=st.epoch,
                                      base_sequence=seq, timestamp_ms=int(time.time() * 1000),
                                      compression=compression)
            self.encoded = (key, data)
        return self.encoded[1]


# A Produce request carries the next batch of every partition with records waiting, up
# to this many bytes (each batch is at most about MAX_REQUEST_BYTES).
MAX_ROUND_BYTES = 4 * MAX_REQUEST_BYTES


class _BranchProducer:
    """Buffers rows per partition and sends them as transactional batches: one Produce
    request per partition leader, each round. Where the coordinator leads them all (one
    broker), in the same write as the AddPartitionsToTxn of those not in the transaction
    yet (the broker handles them in order); else the join is answered first."""

    def __init__(self, o: SinkOptions, r: ClusterRouter, st: wire.TxnState):
        self.o, self.r, self.st = o, r, st
        self.buf: dict[TP, list] = {}   # row path: rows not cut into a chunk yet
        self.size: dict[TP, int] = {}   # buffered key + value bytes per partition
        self.ready: dict[TP, list[_Chunk]] = {}  # chunks to send, in order per partition
        self.added: set[TP] = set()
        self.counts: dict[TP, int] = {}
        self.total = 0
        self.send_s = 0.0  # time in AddPartitionsToTxn and Produce round trips
        self.last_send = time.monotonic()

    def add(self, topic: str, partition: int, rec: tuple) -> None:
        tp = (topic, partition)
        rows = self.buf.setdefault(tp, [])
        rows.append(rec)
        size = self.size[tp] = self.size.get(tp, 0) + len(rec[1] or b"") + len(rec[0] or b"") + 16
        # few large produce requests: each is a round trip (and a log append) on the broker
        if len(rows) >= self.o.batch_rows or size >= self.o.batch_bytes:
            self._seal(tp)
            self._send_ready()

    def add_columns(self, topic: str, partition: int, keys, values, idx, sizes) -> None:
        """add() of the rows `idx` of Arrow columns (sizes: NumPy array of each one's
        add() size), cut into batches at the same records add() would cut."""
        import numpy as np
        tp = (topic, partition)
        self._seal(tp)
        chunks = self.ready.setdefault(tp, [])
        while len(idx):
            # add() cuts once the rows or bytes reach the cap, the record that reaches it included
            reach = np.cumsum(sizes[:self.o.batch_rows])
            k = min(int(np.searchsorted(reach, self.o.batch_bytes, side="left")) + 1, len(reach))
            chunks.append(_Chunk(int(reach[k - 1]), keys=keys, values=values, idx=idx[:k]))
            idx, sizes = idx[k:], sizes[k:]

    def flush_lingering(self) -> None:
        """After an Arrow batch: send what is buffered, unless kafka.linger.ms lets it wait
        for the next ones (fewer, fuller requests; write_branch's last flush sends the rest)."""
        if self.o.producer.linger_ms and (time.monotonic() - self.last_send) * 1000 < self.o.producer.linger_ms:
            return
        self.flush()

    def flush(self, tail=None):
        """Send everything. `tail`, (a function giving the connection it goes to (asked each
        round: a broken one is replaced), (call, result)), goes in the same write as the
        last Produce request; its result is returned (None when nothing was sent)."""
        for tp in list(self.buf):
            self._seal(tp)
        self.last_send = time.monotonic()
        return self._send_ready(tail)

    def _seal(self, tp: TP) -> None:
        rows = self.buf.pop(tp, None)
        size = self.size.pop(tp, 0)
        if rows:
            self.ready.setdefault(tp, []).append(_Chunk(size, rows=rows))

    def _next_round(self) -> dict[TP, _Chunk]:
        out: dict[TP, _Chunk] = {}
        size = 0
        for tp, chunks in self.ready.items():
            if chunks and (not out or size < MAX_ROUND_BYTES):
                out[tp] = chunks[0]
                size += chunks[0].nbytes
        return out

    def _send_ready(self, tail=None):
        """Rounds until everything is sent; `tail` as in flush(). A retriable refusal is
        tried again (the request timeout counts from the last round that sent something)."""
        self.ready = {tp: cs for tp, cs in self.ready.items() if cs}
        box: dict = {"got": None, "why": None}

        def rounds() -> tuple[KafkaError, bool]:
            progressed = False
            while self.ready:
                failure, sent = self._send_round(tail, box)
                progressed = progressed or sent
                if failure is not None:
                    box["why"] = failure
                    return failure[2], progressed
            return KafkaError.NONE, progressed
        err = retry_rounds(self.o, rounds)
        if err != KafkaError.NONE:
            what, (topic, partition), _ = box["why"]
            raise SinkError(f"semel sink: {what} {topic}-{partition}: {err.name}")
        return box["got"]

    def _send_round(self, tail, box: dict):
        """One round: the next chunk of each partition (up to MAX_ROUND_BYTES). Returns
        (None or (what, tp, error) of the first failure, whether any chunk was sent)."""
        t0 = time.perf_counter()
        chunks = self._next_round()
        last = len(chunks) == len(self.ready) and all(len(self.ready[tp]) == 1 for tp in chunks)
        new = sorted(tp for tp in chunks if tp not in self.added)
        data = {tp: ch.encode(self.st, self.st.seq.get(tp, 0), self.o.producer.compression)
                for tp, ch in chunks.items()}
        try:
            add_errs, produced, tail_got = self._round(data, new, tail if last else None)
        except BROKEN:
            # Sent again next round as the same bytes (the broker drops a batch it has by
            # its sequence; a join it has is answered NONE).
            reset_connections(self.r)
            self.send_s += time.perf_counter() - t0
            return ("Produce", min(chunks), KafkaError.NETWORK_EXCEPTION), False
        self.send_s += time.perf_counter() - t0
        refused = {tp: e for tp, e in add_errs.items() if e != KafkaError.NONE}
        if not refused:
            self.added.update(new)
        failed: dict[TP, KafkaError] = {}
        sent = False
        for tp, ch in chunks.items():
            err = produced.get(tp, KafkaError.UNKNOWN_SERVER_ERROR)
            if err == KafkaError.NONE:
                sent = True
                self.st.seq[tp] = self.st.seq.get(tp, 0) + ch.count
                self.counts[tp] = self.counts.get(tp, 0) + ch.count
                self.total += ch.count
                self.ready[tp].pop(0)
                if not self.ready[tp]:
                    del self.ready[tp]
            elif not (refused and tp in new):  # not in the transaction: the join's error tells why
                failed[tp] = err
        # the cause, not the OPERATION_NOT_ATTEMPTED a broker gives the others of a request
        why = sorted(refused.items(), key=lambda kv: kv[1] == KafkaError.OPERATION_NOT_ATTEMPTED)
        what = "AddPartitionsToTxn"
        if not why:
            why, what = sorted(failed.items()), "Produce"
        if not why:
            if last:
                box["got"] = tail_got
            return None, sent
        tp, err = why[0]
        return (what, tp, err), sent

    def _round(self, data: dict[TP, bytes], new: list[TP], tail):
        """One write per broker: AddPartitionsToTxn of `new` (if any), the Produce of
        `data`, `tail` (as in flush(), or None). Returns (the join's errors,
        the produce's errors, the tail's result); errors that say a coordinator or leader
        moved drop it from the routing cache, so the next round asks again."""
        coord = txn_coordinator(self.r, self.o, self.st.txn_id)
        if tail is not None:
            tail = (tail[0](), tail[1])
        leaders = {tp: partition_leader(self.r, tp) for tp in data}
        if all(c is coord for c in leaders.values()) and (tail is None or tail[0] is coord):
            add_errs, produced, tail_got = self._round_on_one(coord, data, new, tail)
        else:
            add_errs, produced, tail_got = self._round_on_many(coord, leaders, data, new, tail)
        for e in add_errs.values():
            self.r.seen(e, coordinator=(route_key(self.o, self.st.txn_id), TRANSACTION))
        for tp, e in produced.items():
            self.r.seen(e, tp=tp)
        return add_errs, produced, tail_got

    def _round_on_one(self, c: Client, data: dict[TP, bytes], new: list[TP], tail):
        calls = []
        if new:
            calls.append((wire.add_partitions_call(c, self.st, new), wire.add_partitions_result))
        calls.append((wire.produce_call(self.st, data), wire.produce_result))
        if tail is not None:
            calls.append(tail[1])
        got = wire.pipelined(c, *calls)
        add_errs = got.pop(0) if new else {}
        return add_errs, got[0], (got[1] if tail is not None else None)

    def _round_on_many(self, coord: Client, leaders: dict[TP, Client], data: dict[TP, bytes],
                       new: list[TP], tail):
        """The join is answered before any Produce to a joined partition is sent (another
        broker would not see it in order); the Produce requests go out to all leaders at
        once, the tail after their answers."""
        add_errs = wire.add_partitions(coord, self.st, new) if new else {}
        if any(e != KafkaError.NONE for e in add_errs.values()):
            data = {tp: d for tp, d in data.items() if tp not in new}
        by_leader: dict[Client, dict[TP, bytes]] = {}
        for tp, d in data.items():
            by_leader.setdefault(leaders[tp], {})[tp] = d
        got = wire.scatter({c: [(wire.produce_call(self.st, part), wire.produce_result)]
                            for c, part in by_leader.items()})
        produced = {tp: e for answers in got.values() for tp, e in answers[0].items()}
        tail_got = wire.pipelined(tail[0], tail[1])[0] if tail is not None else None
        return add_errs, produced, tail_got

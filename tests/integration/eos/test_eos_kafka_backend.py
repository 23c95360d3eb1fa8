"""The real backend on a real broker: ledger, abort rewind, fencing, recovery."""
from __future__ import annotations

import pytest

from semel.eos import (CommitAborted, CommitFatal, CommitSucceeded, Decision, EosRuntime, Ledger, RuntimeFailed,
                       Step)
from semel.eos.kafka import KafkaTxnBackend
from semel.eos.sinks.memory import MemorySink, MemorySinkState
from semel.eos.testing import Crash

N = 20


def make_backend(b, n, instance="0", **kw):
    return KafkaTxnBackend(b.bootstrap, f"{n.app}-{instance}", [(n.input, 0)], marker_topic=kw.pop("marker", None),
                            timeout=20, **kw)


def setup_topics(b, n, values=N):
    b.create_topics((n.input, 1), (n.output, 1))
    b.produce(n.input, [str(i).encode() for i in range(values)])
    return b.marker_for(n.marker)


def processor(sink_name="m", per_cycle=None, fail_after=None):
    seen = {"n": 0}

    def process(rec, ctx):
        seen["n"] += 1
        if fail_after is not None and seen["n"] == fail_after:
            raise RuntimeError("application failed mid-cycle")
        ctx.send(ctx_out[0], rec.value)
        ctx.stage(sink_name, int(rec.value))
    ctx_out = [None]
    return process, ctx_out


def drain(rt, out_topic, want, sink_state, max_cycles=40):
    process, out = processor()
    out[0] = out_topic
    for _ in range(max_cycles):
        if len(sink_state.committed_rows()) >= want:
            break
        rt.run(process, max_cycles=1)


def test_fresh_group_has_an_empty_ledger_and_cycles_record_theirs(eos_broker, names):
    marker = setup_topics(eos_broker, names)
    backend = make_backend(eos_broker, names, marker=marker)
    state = MemorySinkState()
    rt = EosRuntime(names.app, "0", backend, [MemorySink("m", state)], commit_interval=0.3)
    report = rt.start()
    assert report.ledger == Ledger(0) and report.next_cycle == 1
    drain(rt, names.output, N, state)
    assert state.committed_rows() == list(range(N))
    last = rt.next_cycle - 1
    rt.close()
    again = make_backend(eos_broker, names, marker=marker)
    again.init()
    assert again.read_ledger() == Ledger(last)
    assert again.positions == {(names.input, 0): N}
    again.close()


def test_cycles_without_input_still_advance_the_ledger(eos_broker, names):
    # Offsets-only transactions: Tansu 0.6 drops their offsets unless the marker record is there.
    marker = setup_topics(eos_broker, names, values=0)
    rt = EosRuntime(names.app, "0", make_backend(eos_broker, names, marker=marker), [MemorySink("m")],
                    commit_interval=0.1)
    rt.start()
    for _ in range(4):
        assert isinstance(rt.run_cycle(), CommitSucceeded)
    rt.close()
    again = make_backend(eos_broker, names, marker=marker)
    again.init()
    assert again.read_ledger() == Ledger(4)
    again.close()


def test_offset_metadata_carries_the_ledger_when_the_broker_keeps_it(eos_broker, names):
    if not eos_broker.keeps_offset_metadata:
        pytest.skip(f"{eos_broker.kind} drops offset metadata; the marker topic carries the ledger there")
    from confluent_kafka import Consumer, TopicPartition
    setup_topics(eos_broker, names, values=3)
    rt = EosRuntime(names.app, "0", make_backend(eos_broker, names), [MemorySink("m")], commit_interval=0.3)
    rt.start()
    process, out = processor()
    out[0] = names.output
    rt.run(process, max_cycles=2)
    rt.close()
    c = Consumer({"bootstrap.servers": eos_broker.bootstrap, "group.id": f"{names.app}-0"})
    got = c.committed([TopicPartition(names.input, 0)], timeout=10)[0]
    c.close()
    assert got.metadata == f"semel-eos/1 t={names.app}-0 c=2 h=0"


def test_abort_rewinds_consumption_so_records_are_processed_once(eos_broker, names):
    marker = setup_topics(eos_broker, names, values=6)
    state = MemorySinkState()
    rt = EosRuntime(names.app, "0", make_backend(eos_broker, names, marker=marker),
                    [MemorySink("m", state)], commit_interval=1.0)
    rt.start()
    process, out = processor(fail_after=4)
    out[0] = names.output
    outcome = rt.run(process, max_cycles=1)
    assert isinstance(outcome, CommitAborted) and outcome.step is Step.FLUSH
    assert state.committed_rows() == []
    drain(rt, names.output, 6, state)
    assert state.committed_rows() == list(range(6))
    rt.close()


def test_a_newer_instance_fences_the_older_one(eos_broker, names):
    marker = setup_topics(eos_broker, names, values=4)
    old = EosRuntime(names.app, "0", make_backend(eos_broker, names, marker=marker), [MemorySink("m")],
                     commit_interval=0.2)
    old.start()
    new_state = MemorySinkState()
    new = EosRuntime(names.app, "0", make_backend(eos_broker, names, marker=marker),
                     [MemorySink("m", new_state)], commit_interval=0.2)
    new.start()
    process, out = processor()
    out[0] = names.output
    with pytest.raises(RuntimeFailed) as info:
        old.run(process, max_cycles=3)
    assert isinstance(info.value.outcome, CommitFatal)
    drain(new, names.output, 4, new_state)
    assert new_state.committed_rows() == list(range(4))
    old.close()
    new.close()


@pytest.mark.parametrize("crash_at,decision", [("after:commitTxn", Decision.COMMIT),
                                               ("after:preCommit2PC", Decision.ABORT)])
def test_crash_around_commit_txn_is_resolved_from_the_ledger(eos_broker, names, crash_at, decision):
    marker = setup_topics(eos_broker, names, values=5)
    state = MemorySinkState()

    def crash(event):
        if event == crash_at:
            raise Crash(event)
    rt = EosRuntime(names.app, "0", make_backend(eos_broker, names, marker=marker), [MemorySink("m", state)],
                    commit_interval=1.0, on_event=crash)
    rt.start()
    process, out = processor()
    out[0] = names.output
    with pytest.raises(Crash):
        rt.run(process, max_cycles=1)
    assert list(state.prepared) == [f"{names.app}-0-1"]
    # "restart": a new instance (its init_transactions completes or aborts the open transaction)
    rt2 = EosRuntime(names.app, "0", make_backend(eos_broker, names, marker=marker), [MemorySink("m", state)],
                     commit_interval=0.3)
    report = rt2.start()
    assert [(a.txn_id, a.decision) for a in report.actions] == [(f"{names.app}-0-1", decision)]
    assert not state.prepared
    drain(rt2, names.output, 5, state)
    assert state.committed_rows() == list(range(5))
    assert (f"{names.app}-0-1" in state.committed) == (decision is Decision.COMMIT)
    rt2.close()
    rt.backend.close()


def test_transaction_timeout_follows_the_commit_interval():
    c = KafkaTxnBackend("127.0.0.1:1", "a-0", [("t", 0)])
    EosRuntime("a", "0", c, commit_interval=300)
    assert c._producer_config["transaction.timeout.ms"] == 630_000
    c = KafkaTxnBackend("127.0.0.1:1", "a-0", [("t", 0)])
    EosRuntime("a", "0", c, commit_interval=0.1)
    assert c._producer_config["transaction.timeout.ms"] == 60_000
    with pytest.raises(ValueError, match="too short"):
        EosRuntime("a", "0", KafkaTxnBackend("127.0.0.1:1", "a-0", [("t", 0)], transaction_timeout_ms=60_000),
                   commit_interval=120)


def test_bad_configuration_is_a_clear_error():
    with pytest.raises(ValueError, match="input partitions or a marker"):
        KafkaTxnBackend("127.0.0.1:1", "a-0", [])
    with pytest.raises(ValueError, match="topic, partition"):
        KafkaTxnBackend("127.0.0.1:1", "a-0", [("t", "0")])

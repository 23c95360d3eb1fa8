"""Chaos suite for the commit cycle: a failure at every step, against a pure model.

Two layers:

1. The outcome table of the issue, written out literally, one failure per
   step (and failures inside the abort path).
2. Hypothesis generates failure schedules (any subset of backend and
   participant operations failing in any way) and the cycle is compared with
   `model()`, a from-the-spec oracle of outcome and end state. Every example
   then "restarts" (new backend, sinks and store on the same external
   state), runs recovery, and checks the invariant: each participant holds
   the cycle's data committed if and only if the broker committed it, and
   nothing is left prepared.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semel.eos import (CommitAborted, CommitFatal, CommitSucceeded, CycleParts, EosMetrics, RecordingBroker,
                       RecordingTxnBackend, SinkGuard, Step, TransactionalStore, recover, run_commit_cycle)
from semel.eos.backend import Fault
from semel.eos.sinks.memory import MemorySink, MemorySinkState
from semel.eos.store import MemoryBacking
from semel.eos.testing import EFFECT_KINDS, FATAL_KINDS, KINDS, RELEASE_HANGS, FaultySink

APP, INST = "app", "0"
CYCLE = 1
TXN = f"{APP}-{INST}-{CYCLE}"


@pytest.fixture(autouse=True, scope="module")
def _release_hung_threads():
    RELEASE_HANGS.clear()
    yield
    RELEASE_HANGS.set()


# ---------------------------------------------------------------- the world under test

@dataclass
class Schedule:
    backend: dict[str, Fault] = field(default_factory=dict)  # begin_txn flush commit_offsets commit_txn abort_txn
    work_fails: bool = False
    store: dict[str, str] = field(default_factory=dict)    # prepare commit abort -> kind
    sinks: list[dict[str, str]] = field(default_factory=lambda: [{}])


@dataclass
class World:
    broker: RecordingBroker
    backing: MemoryBacking
    states: list[MemorySinkState]


def build(schedule: Schedule):
    world = World(RecordingBroker(inputs=list(range(10))), MemoryBacking(),
                  [MemorySinkState() for _ in schedule.sinks])
    backend = RecordingTxnBackend(world.broker, f"{APP}-{INST}")
    for op, fault in schedule.backend.items():
        backend.faults[op] = fault
    backend.init()
    store = TransactionalStore(world.backing)
    sinks = [FaultySink(MemorySink(f"s{i}", st_), faults, timeout=_timeout(faults))
             for i, (st_, faults) in enumerate(zip(world.states, schedule.sinks))]
    store_p = FaultySink(store, schedule.store, timeout=_timeout(schedule.store))

    def work():
        for _ in range(3):
            rec = backend.poll(0)
            for s in sinks:
                s.stage(rec.value)
            backend.produce("out", rec.value)
            store.put(f"k{rec.offset}", rec.value)
        if schedule.work_fails:
            raise RuntimeError("application code failed")

    metrics = EosMetrics()
    parts = CycleParts(backend, [SinkGuard(s) for s in sinks], SinkGuard(store_p), work=work, metrics=metrics)
    return world, parts, metrics


def _timeout(faults: dict[str, str]):
    # Only a scheduled hang needs the guard's timeout; everything else runs
    # inline, so a slow machine cannot turn a plain call into a "hang".
    return 0.25 if "hang" in faults.values() else None


def restart_and_recover(world: World, n_sinks: int):
    backend = RecordingTxnBackend(world.broker, f"{APP}-{INST}")
    backend.init()
    store = TransactionalStore(world.backing)
    sinks = [MemorySink(f"s{i}", world.states[i]) for i in range(n_sinks)]
    report = recover(APP, INST, backend.read_ledger(), [SinkGuard(store)] + [SinkGuard(s) for s in sinks])
    return report


def assert_consistent_after_recovery(world: World, n_sinks: int) -> None:
    report = restart_and_recover(world, n_sinks)
    committed = CYCLE in world.broker.committed_cycles()
    for i, state in enumerate(world.states):
        assert not state.prepared, f"s{i} still has prepared batches after recovery: {state.prepared}"
        assert (TXN in state.committed) == committed, f"s{i} committed={TXN in state.committed}, broker={committed}"
        if committed:
            assert state.committed[TXN] == [0, 1, 2]
    assert world.backing.pending() == []
    assert (dict(world.backing.items()) == {"k0": 0, "k1": 1, "k2": 2}) == committed
    if committed:
        assert world.broker.output() == [("out", None, 0), ("out", None, 1), ("out", None, 2)]
    # The next cycle never reuses the number of a committed one.
    assert report.next_cycle > max(world.broker.committed_cycles(), default=0)


# ---------------------------------------------------------------- 1. the literal outcome table

TABLE = [
    # (id, schedule, expected outcome class, failing step)
    ("none", Schedule(), CommitSucceeded, None),
    ("beginTxn", Schedule(backend={"begin_txn": Fault()}), CommitFatal, Step.BEGIN_TXN),
    ("flush/work", Schedule(work_fails=True), CommitAborted, Step.FLUSH),
    ("flush/producer", Schedule(backend={"flush": Fault()}), CommitAborted, Step.FLUSH),
    ("commitOffsets", Schedule(backend={"commit_offsets": Fault()}), CommitAborted, Step.COMMIT_OFFSETS),
    ("preCommit2PC/sink", Schedule(sinks=[{}, {"prepare": "retryable"}]), CommitAborted, Step.PRE_COMMIT_2PC),
    ("preCommit2PC/store", Schedule(store={"prepare": "raise"}), CommitAborted, Step.PRE_COMMIT_2PC),
    ("preCommit2PC/fatal", Schedule(sinks=[{"prepare": "fatal"}]), CommitFatal, Step.PRE_COMMIT_2PC),
    ("commitTxn", Schedule(backend={"commit_txn": Fault()}), CommitAborted, Step.COMMIT_TXN),
    ("commit2PC", Schedule(sinks=[{"commit": "raise"}, {}]), CommitFatal, Step.COMMIT_2PC),
    ("storeCommit", Schedule(store={"commit": "retryable"}), CommitFatal, Step.STORE_COMMIT),
    # failures inside the abort paths
    ("flush+abortTxn", Schedule(work_fails=True, backend={"abort_txn": Fault()}), CommitFatal, Step.FLUSH),
    ("flush+storeAbort", Schedule(work_fails=True, store={"abort": "raise"}), CommitFatal, Step.FLUSH),
    ("flush+sinkAbort", Schedule(work_fails=True, sinks=[{"abort": "hang"}]), CommitAborted, Step.FLUSH),
    ("commitTxn-ambiguous", Schedule(backend={"commit_txn": Fault(after=True)}), CommitFatal, Step.COMMIT_TXN),
]


@pytest.mark.parametrize("schedule,cls,step", [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_outcome_table(schedule, cls, step):
    world, parts, metrics = build(schedule)
    outcome = run_commit_cycle(CYCLE, TXN, parts)
    assert type(outcome) is cls, outcome
    assert getattr(outcome, "step", None) == step
    assert metrics.value("semel_eos_cycles_total", {"outcome": outcome.kind, "step": str(step or "none")}) == 1
    assert model(schedule)[:2] == (outcome.kind, step)
    assert_consistent_after_recovery(world, len(schedule.sinks))


def test_precommit_failure_aborts_every_sink_that_prepared():
    world, parts, _ = build(Schedule(sinks=[{}, {}, {"prepare": "retryable"}]))
    run_commit_cycle(CYCLE, TXN, parts)
    calls = [s.sink.calls for s in parts.sinks]
    assert calls[0] == [("prepare", TXN), ("abort", TXN)]
    assert calls[1] == [("prepare", TXN), ("abort", TXN)]
    assert all(not st_.prepared and not st_.committed for st_ in world.states)


def test_commit2pc_failure_still_commits_the_other_sinks_and_the_store():
    world, parts, _ = build(Schedule(sinks=[{"commit": "fatal"}, {}]))
    outcome = run_commit_cycle(CYCLE, TXN, parts)
    assert isinstance(outcome, CommitFatal) and outcome.stranded == ("s0",)
    assert TXN in world.states[0].prepared and TXN in world.states[1].committed
    assert dict(world.backing.items()) == {"k0": 0, "k1": 1, "k2": 2}


def test_ambiguous_commit_leaves_everything_prepared_and_recovery_commits():
    world, parts, _ = build(Schedule(backend={"commit_txn": Fault(after=True)}, sinks=[{}, {}]))
    outcome = run_commit_cycle(CYCLE, TXN, parts)
    assert isinstance(outcome, CommitFatal) and set(outcome.stranded) == {"store", "s0", "s1"}
    assert all(TXN in st_.prepared for st_ in world.states)
    report = restart_and_recover(world, 2)
    assert {(a.participant, str(a.decision)) for a in report.actions} == {
        ("store", "commit"), ("s0", "commit"), ("s1", "commit")}
    assert all(TXN in st_.committed for st_ in world.states)


def test_sink_abort_failure_is_reported_as_stranded():
    world, parts, _ = build(Schedule(backend={"commit_offsets": Fault()}, sinks=[{}, {"abort": "garbage"}]))
    outcome = run_commit_cycle(CYCLE, TXN, parts)
    # garbage from abort means the sink is broken: fatal, but the cycle still rolled back everywhere else
    assert isinstance(outcome, CommitFatal) and outcome.stranded == ("s1",)
    assert world.broker.aborted == [CYCLE]


# ---------------------------------------------------------------- 2. model + hypothesis

def _effect(kind):
    return kind is None or kind in EFFECT_KINDS


def model(s: Schedule):
    """Expected (outcome kind, failing step, broker, store, sinks) from the issue's rules alone.

    broker: none|open|committed|aborted; store: buffered|pending|committed|dropped;
    each sink: absent|prepared|committed.
    """
    broker, store, sinks = "none", "buffered", ["absent"] * len(s.sinks)
    c = s.backend
    if "begin_txn" in c:
        return "fatal", Step.BEGIN_TXN, ("open" if c["begin_txn"].after else "none"), store, sinks
    broker = "open"
    failed, fatal = None, False
    if s.work_fails or "flush" in c:
        failed = Step.FLUSH
    elif "commit_offsets" in c:
        failed = Step.COMMIT_OFFSETS
    else:
        k = s.store.get("prepare")
        if _effect(k):
            store = "pending"
        if k is not None:
            failed, fatal = Step.PRE_COMMIT_2PC, k in FATAL_KINDS
        else:
            for i, faults in enumerate(s.sinks):
                k = faults.get("prepare")
                if _effect(k):
                    sinks[i] = "prepared"
                if k is not None:
                    failed, fatal = Step.PRE_COMMIT_2PC, k in FATAL_KINDS
                    break
    if failed is None:
        f = c.get("commit_txn")
        if f is None or f.after:
            broker = "committed"
        if f is not None:
            failed = Step.COMMIT_TXN
    if failed is not None:
        return _model_abort(s, failed, fatal, broker, store, sinks)
    stranded = False
    for i, faults in enumerate(s.sinks):
        k = faults.get("commit")
        if _effect(k):
            sinks[i] = "committed"
        stranded = stranded or k is not None
    k = s.store.get("commit")
    if _effect(k):
        store = "committed"
    if stranded:
        return "fatal", Step.COMMIT_2PC, broker, store, sinks
    if k is not None:
        return "fatal", Step.STORE_COMMIT, broker, store, sinks
    return "succeeded", None, broker, store, sinks


def _model_abort(s, failed, fatal, broker, store, sinks):
    f = s.backend.get("abort_txn")
    abort_ok = broker == "open" and f is None
    if broker == "open" and (f is None or f.after):
        broker = "aborted"
    if not abort_ok:
        if failed is Step.COMMIT_TXN:
            return "fatal", failed, broker, store, sinks
        fatal = True
    k = s.store.get("abort")
    if _effect(k):
        store = "dropped"
    fatal = fatal or k is not None
    for i, faults in enumerate(s.sinks):
        k = faults.get("abort")
        if _effect(k):
            sinks[i] = "absent"
        fatal = fatal or k in FATAL_KINDS
    return ("fatal" if fatal else "aborted"), failed, broker, store, sinks


def observed(world: World, outcome):
    b = world.broker
    broker = ("committed" if CYCLE in b.committed_cycles() else "aborted" if CYCLE in b.aborted
              else "open" if b.open else "none")
    if TXN in world.backing.pending():
        store = "pending"
    elif dict(world.backing.items()):
        store = "committed"
    else:
        store = "dropped_or_buffered"
    sinks = ["committed" if TXN in st_.committed else "prepared" if TXN in st_.prepared else "absent"
             for st_ in world.states]
    return outcome.kind, getattr(outcome, "step", None), broker, store, sinks


kinds = st.sampled_from(KINDS)
coord_fault = st.builds(Fault, after=st.booleans())
schedules = st.builds(
    Schedule,
    backend=st.dictionaries(st.sampled_from(["begin_txn", "flush", "commit_offsets", "commit_txn", "abort_txn"]),
                          coord_fault, max_size=2),
    work_fails=st.booleans(),
    store=st.dictionaries(st.sampled_from(["prepare", "commit", "abort"]), kinds, max_size=2),
    sinks=st.lists(st.dictionaries(st.sampled_from(["prepare", "commit", "abort"]), kinds, max_size=2),
                   min_size=1, max_size=3),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules)
def test_cycle_matches_model_and_recovery_restores_consistency(schedule):
    world, parts, _ = build(schedule)
    outcome = run_commit_cycle(CYCLE, TXN, parts)
    want = model(schedule)
    got = observed(world, outcome)
    assert got[:3] == want[:3]
    assert got[4] == want[4]
    want_store = {"pending": "pending", "committed": "committed"}.get(want[3], "dropped_or_buffered")
    assert got[3] == want_store
    # Never: a sink row visible while the broker transaction is not committed.
    if got[2] != "committed":
        assert "committed" not in got[4] and got[3] != "committed"
    assert_consistent_after_recovery(world, len(schedule.sinks))

"""Property: any history of faults and crashes still gives exactly-once everywhere.

Hypothesis draws a sequence of cycle attempts, each with at most one fault:
a backend operation failing (before or after its effect), a participant
operation misbehaving in any of the `semel.eos.testing` ways (including a
crash before or after its effect), or a crash at any point between steps.
A crash or a CommitFatal "restarts" the instance: a new backend, new sinks
and a new store on the same external state, then recovery. After the drawn
attempts, clean cycles run until the input is consumed, then one last restart.

Checked at the end, from the external state alone:
- the broker output, each sink's committed rows and the store hold every
  input exactly once;
- every committed sink batch belongs to a broker-committed cycle and holds
  the same inputs as that broker transaction;
- nothing is left prepared or pending.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semel.eos import (CommitFatal, EosRuntime, RecordingBroker, RecordingTxnBackend, RecoveryError,
                       RuntimeFailed, TransactionalStore)
from semel.eos.backend import Fault
from semel.eos.sinks.memory import MemorySink, MemorySinkState
from semel.eos.store import MemoryBacking
from semel.eos.testing import KINDS, RELEASE_HANGS, Crash, FaultySink

N_INPUTS = 12
PER_CYCLE = 3
EVENTS = [f"{w}:{s}" for s in ("beginTxn", "flush", "commitOffsets", "preCommit2PC", "commitTxn", "commit2PC",
                               "storeCommit") for w in ("before", "after")] + ["preCommit2PC:a", "commit2PC:a"]


@pytest.fixture(autouse=True, scope="module")
def _release_hung_threads():
    RELEASE_HANGS.clear()
    yield
    RELEASE_HANGS.set()


class Instance:
    """One 'process': runtime, backend, sinks and store over shared external state."""

    def __init__(self, world: "World"):
        self.backend = RecordingTxnBackend(world.broker, "app-0")
        self.sinks = {n: FaultySink(MemorySink(n, world.states[n]), timeout=0.25) for n in ("a", "b")}
        self.store_inner = TransactionalStore(world.backing)
        self.store = FaultySink(self.store_inner, timeout=0.25)
        self.crash_at: str | None = None
        self.rt = EosRuntime("app", "0", self.backend, list(self.sinks.values()), commit_interval=1.0,
                             on_event=self._event)
        # The runtime guards the store through FaultySink so store faults can be injected too.
        self.rt.store = self.store_inner
        self.rt.store_guard = self.rt._guard(self.store)

    def _event(self, name: str) -> None:
        if name == self.crash_at:
            raise Crash(name)

    def work(self, ctx) -> None:
        for _ in range(PER_CYCLE):
            rec = self.backend.poll(0)
            if rec is None:
                return
            for s in self.sinks.values():
                s.stage(rec.value)
            ctx.send("out", rec.value)
            self.store_inner.put(f"k{rec.value}", rec.value)
            self.store_inner.put("count", self.store_inner.get("count", 0) + 1)


class World:
    def __init__(self):
        self.broker = RecordingBroker(inputs=list(range(N_INPUTS)))
        self.backing = MemoryBacking()
        self.states = {"a": MemorySinkState(), "b": MemorySinkState()}
        self.restarts = 0

    def start(self, attempts: int = 20) -> Instance:
        for _ in range(attempts):
            inst = Instance(self)
            self.restarts += 1
            try:
                inst.rt.start()
                return inst
            except (Crash, RecoveryError):
                continue
        raise AssertionError("could not start a clean instance")


fault_specs = st.one_of(
    st.just(("none",)),
    st.tuples(st.just("backend"), st.sampled_from(["begin_txn", "flush", "commit_offsets", "commit_txn",
                                                 "abort_txn"]), st.booleans()),
    st.tuples(st.just("part"), st.sampled_from(["a", "b", "store"]), st.sampled_from(["prepare", "commit", "abort"]),
              st.sampled_from(KINDS + ("crash", "crash_before"))),
    st.tuples(st.just("crash_at"), st.sampled_from(EVENTS)),
)


def install(inst: Instance, spec) -> None:
    if spec[0] == "backend":
        inst.backend.faults[spec[1]] = Fault(after=spec[2])
    elif spec[0] == "part":
        target = inst.store if spec[1] == "store" else inst.sinks[spec[1]]
        target.faults[spec[2]] = spec[3]
    elif spec[0] == "crash_at":
        inst.crash_at = spec[1]


def run_attempt(world: World, inst: Instance) -> Instance:
    try:
        outcome = inst.rt.run_cycle(inst.work)
    except Crash:
        return world.start()
    if isinstance(outcome, CommitFatal):
        with pytest.raises(RuntimeFailed):
            inst.rt.run_cycle(inst.work)
        return world.start()
    return inst


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(fault_specs, min_size=1, max_size=12))
def test_any_fault_history_is_exactly_once(specs):
    world = World()
    inst = world.start()
    for spec in specs:
        install(inst, spec)
        inst = run_attempt(world, inst)
    # Clean phase: fresh instance (drops unfired faults), run until the input is consumed.
    inst = world.start()
    for _ in range(N_INPUTS * 4):
        if world.broker.position == N_INPUTS:
            break
        inst = run_attempt(world, inst)
    assert world.broker.position == N_INPUTS
    world.start()  # a last restart resolves anything a late (timed-out) call left behind
    check_exactly_once(world)


def check_exactly_once(world: World) -> None:
    inputs = list(range(N_INPUTS))
    b = world.broker
    assert [r[2] for r in b.output()] == inputs
    broker_rows = {f"app-0-{c.cycle}": [r[2] for r in c.records] for c in b.committed}
    for name, state in world.states.items():
        assert not state.prepared, f"{name} left prepared: {state.prepared}"
        assert state.committed_rows() == inputs, f"{name} committed {state.committed_rows()}"
        for txn_id, rows in state.committed.items():
            assert txn_id in broker_rows, f"{name} committed {txn_id} but the broker did not"
            assert rows == broker_rows[txn_id]
        # the other direction: every broker cycle that carried rows is committed in the sink
        assert {t for t, rows in broker_rows.items() if rows} <= set(state.committed)
    assert world.backing.pending() == []
    live = dict(world.backing.items())
    assert live.pop("count") == N_INPUTS
    assert live == {f"k{i}": i for i in inputs}

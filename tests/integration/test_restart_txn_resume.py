"""Transactions resume after a broker SIGKILL and restart (issue 16).

Clients: an unmodified confluent-kafka, kafka-python or aiokafka producer
commits transactions with send_offsets_to_transaction; the broker is SIGKILLed
after each step of one transaction, or 0-50 ms (seeded) after its
commit_transaction was called, and restarted on the same data directory. The
next transaction must commit within a liveness bound, no client call may
outlive its deadline, and a read_committed reader and the group's committed
offset must show every committed transaction exactly once
(tests/support/restart_txn.py).

The confluent-kafka producer runs with semel.eos.kafka.RESTART_SAFE_CONFIG:
with librdkafka's default re-bootstrap its send_offsets_to_transaction waits
for ever after a single broker restarts (docs/librdkafka-restart-hang.md);
the last test shows that hang and that the runtime's deadline turns it into
an aborted cycle and a retry.

Runtime: the exactly-once commit cycle (semel.eos) across a broker restart at
several steps: every input ends in the sink and the output topic exactly once,
and cycles commit again soon after the restart. The Spark sink's wire client
(semel.client, used by semel.spark.sink) gives up on a broker that stops
answering within its request timeout instead of waiting.
"""
from __future__ import annotations

import time

import pytest

from semel.cli.process import SemelBroker
from semel.client import Client
from semel.eos import CommitAborted, CommitFatal, CommitSucceeded, EosRuntime, RuntimeFailed, Step
from semel.eos.kafka import KafkaCoordinator
from semel.eos.sinks.memory import MemorySink, MemorySinkState
from semel.protocol import records
from tests.support.consume import read_values
from tests.support.restart_txn import RESUME_BOUND_S, BackgroundRestart, cases, run_case

SEED = 16


@pytest.mark.parametrize("client,point,delay_ms", cases(SEED, per_client=7))
def test_next_transaction_commits_after_a_broker_restart(tmp_path, client, point, delay_ms):
    result = run_case(client, point, delay_ms, tmp_path)
    assert result.check() == [], result


# --- the exactly-once runtime ---------------------------------------------------------

N = 12


class Restarter(BackgroundRestart):
    """The broker SIGKILLed and restarted from inside a cycle (an on_event hook), once."""

    def __init__(self, broker: SemelBroker, event: str, delay_ms: int):
        super().__init__(broker)
        self.event, self.delay_ms = event, delay_ms

    def __call__(self, event: str) -> None:
        if event == self.event:
            self.arm(self.delay_ms)


def _eos_broker(tmp_path) -> SemelBroker:
    b = SemelBroker(tmp_path / "data", log_path=tmp_path / "broker.log",
                    extra_args=["--group-initial-rebalance-delay-ms", "0"])
    b.start()
    with Client(b.bootstrap) as c:
        c.create_topic("in", 1)
        c.create_topic("out", 1)
        err, _ = c.produce("in", 0, records.build_batch([(None, str(i).encode()) for i in range(N)]))
        assert not err
    return b


def _runtime(b: SemelBroker, state: MemorySinkState, hook=None, **coordinator_kw) -> EosRuntime:
    coord = KafkaCoordinator(b.bootstrap, "rs-0", [("in", 0)], **coordinator_kw)
    rt = EosRuntime("rs", "0", coord, [MemorySink("m", state)], commit_interval=0.3, on_event=hook)
    rt.start()
    return rt


def _process(rec, ctx):
    ctx.send("out", rec.value)
    ctx.stage("m", int(rec.value))


def _cycle(rt: EosRuntime):
    try:
        return rt.run(_process, max_cycles=1)
    except RuntimeFailed as exc:
        return exc.outcome


def _run_until_done(b: SemelBroker, rt: EosRuntime, state: MemorySinkState, restarted, bound_s: float = 90):
    """Cycles until every input committed and a cycle committed after the restart
    (restarted() is when it finished, None before). A CommitFatal restarts the
    application (a fresh runtime, whose start() recovers), as the process would
    be restarted. Returns the outcomes and the seconds from the restart to the
    first cycle committed after it."""
    outcomes, resumed = [], None
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        outcome = _cycle(rt)
        outcomes.append(outcome)
        at = restarted()
        if at is not None and resumed is None and isinstance(outcome, CommitSucceeded):
            resumed = time.monotonic() - at
        if resumed is not None and len(state.committed_rows()) >= N:
            break
        if isinstance(outcome, CommitFatal):
            rt.close()
            rt = _runtime(b, state, timeout=10)
    rt.close()
    return outcomes, resumed


def _assert_exact(b: SemelBroker, state: MemorySinkState) -> None:
    assert state.committed_rows() == list(range(N))
    assert sorted(read_values(b.bootstrap, "out", 1, want=N), key=int) == [str(i) for i in range(N)]


@pytest.mark.parametrize("event,delay_ms", [("before:beginTxn", 0), ("before:flush", 5), ("before:commitOffsets", 0),
                                            ("before:commitOffsets", 20), ("before:commitTxn", 0),
                                            ("before:commitTxn", 3), ("before:commitTxn", 40)])
def test_runtime_cycles_resume_after_a_broker_restart(tmp_path, event, delay_ms):
    b = _eos_broker(tmp_path)
    hook = Restarter(b, event, delay_ms)
    try:
        state = MemorySinkState()
        rt = _runtime(b, state, hook, timeout=10)
        outcomes, resumed = _run_until_done(b, rt, state, lambda: hook.restarted_at)
        # Live: a cycle commits after the restart (aborted and fatal ones allowed before it).
        assert resumed is not None and resumed < RESUME_BOUND_S, outcomes
        _assert_exact(b, state)
    finally:
        hook.join()
        b.close()


def test_a_client_call_stuck_past_its_deadline_becomes_an_aborted_cycle(tmp_path):
    """librdkafka's own default (re-bootstrap) strands send_offsets_to_transaction
    after the restart; the deadline abandons the call, the abort replaces the
    producer (fencing the stuck one) and the next cycle commits."""
    b = _eos_broker(tmp_path)
    try:
        state = MemorySinkState()
        rt = _runtime(b, state, timeout=3, producer_config={"metadata.recovery.strategy": "rebootstrap"})
        assert isinstance(_cycle(rt), CommitSucceeded)
        b.kill()
        b.start()
        restarted = time.monotonic()
        outcomes, resumed = _run_until_done(b, rt, state, lambda: restarted)
        assert resumed is not None, outcomes
        stuck = [o for o in outcomes if "abandoned" in getattr(o, "reason", "")]
        assert stuck, f"the hang did not happen, so the deadline was not shown: {outcomes}"
        assert all(isinstance(o, CommitAborted) and o.step is Step.COMMIT_OFFSETS for o in stuck), outcomes
        assert not any(isinstance(o, CommitFatal) for o in outcomes), outcomes
        _assert_exact(b, state)
    finally:
        b.close()


def test_the_sink_wire_client_gives_up_on_a_silent_broker(tmp_path):
    """semel.spark.sink speaks through semel.client with kafka.request.timeout.ms as
    its socket timeout: a broker that stops answering (SIGSTOP) fails the call."""
    from semel.client.txn import init_producer_id
    b = SemelBroker(tmp_path / "data", log_path=tmp_path / "broker.log")
    b.start()
    try:
        with Client(b.bootstrap, timeout_s=1.0) as c:
            assert init_producer_id(c, "sink-deadline", 60_000)[0] == 0
            b.pause()
            try:
                with pytest.raises(OSError):   # socket.timeout: the call ends, nothing hangs
                    init_producer_id(c, "sink-deadline", 60_000)
            finally:
                b.resume()
    finally:
        b.close()

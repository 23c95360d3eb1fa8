"""Transactions resume after a broker SIGKILL and restart.

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

import json
import subprocess
import sys
from pathlib import Path

import pytest

from semel.client import Client
from semel.eos import Step
from semel.eos.sinks.memory import MemorySinkState
from semel.launch.process import SemelBroker
from tests.support.read_end import read_to_end
from tests.support.restart_eos import N, fill_input, run_until_done, runtime
from tests.support.restart_txn import RESUME_BOUND_S, BackgroundRestart, cases, run_case

SEED = 16
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("client,point,delay_ms", cases(SEED, per_client=7))
def test_next_transaction_commits_after_a_broker_restart(tmp_path, client, point, delay_ms):
    result = run_case(client, point, delay_ms, tmp_path)
    assert result.check() == [], result


# --- the exactly-once runtime ---------------------------------------------------------


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
    fill_input(b.bootstrap)
    return b


def _assert_exact(b: SemelBroker, committed: list[int]) -> None:
    assert committed == list(range(N))
    # after the runtime's last commit returned (an earlier producer's transaction ended
    # before its successor's init did): the end read is final
    assert sorted(read_to_end(b.bootstrap, "out", 1), key=int) == [str(i) for i in range(N)]


@pytest.mark.parametrize("event,delay_ms", [("before:beginTxn", 0), ("before:flush", 5), ("before:commitOffsets", 0),
                                            ("before:commitOffsets", 20), ("before:commitTxn", 0),
                                            ("before:commitTxn", 3), ("before:commitTxn", 40)])
def test_runtime_cycles_resume_after_a_broker_restart(tmp_path, event, delay_ms):
    b = _eos_broker(tmp_path)
    hook = Restarter(b, event, delay_ms)
    try:
        state = MemorySinkState()
        rt = runtime(b.bootstrap, state, hook, timeout=10)
        outcomes, resumed = run_until_done(b.bootstrap, rt, state, lambda: hook.restarted_at)
        # Live: a cycle commits after the restart (aborted and fatal ones allowed before it).
        assert resumed is not None and resumed < RESUME_BOUND_S, outcomes
        _assert_exact(b, state.committed_rows())
    finally:
        hook.join()
        b.close()


def test_a_client_call_stuck_past_its_deadline_becomes_an_aborted_cycle(tmp_path):
    """librdkafka's own default (re-bootstrap) strands send_offsets_to_transaction
    after the restart; the deadline abandons the call, the abort replaces the
    producer (fencing the stuck one) and the next cycle commits. The application
    runs in a child process (tests/support/restart_eos.py) that ends, stuck
    thread and all, before the broker stops."""
    b = _eos_broker(tmp_path)
    config = json.dumps({"metadata.recovery.strategy": "rebootstrap"})
    app = subprocess.Popen([sys.executable, "-m", "tests.support.restart_eos", b.bootstrap, "3", config],
                           cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(app.stdout.readline())["kind"] == "succeeded"
        b.kill()
        b.start()
        out, _ = app.communicate("restarted\n", timeout=180)
        assert app.returncode == 0, out
        report = json.loads(out.splitlines()[-1])
        outcomes = report["outcomes"]
        assert report["resumed"] is not None, outcomes
        stuck = [o for o in outcomes if "abandoned" in o["reason"]]
        assert stuck, f"the hang did not happen, so the deadline was not shown: {outcomes}"
        assert all(o["kind"] == "aborted" and o["step"] == Step.COMMIT_OFFSETS.value for o in stuck), outcomes
        assert not any(o["kind"] == "fatal" for o in outcomes), outcomes
        _assert_exact(b, report["committed"])
    finally:
        if app.poll() is None:
            app.kill()
            app.communicate()
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

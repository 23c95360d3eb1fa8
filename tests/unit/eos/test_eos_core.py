"""Unit tests: txn ids, ledger, decisions, the sink guard, recovery rules, runtime checks, metrics."""
from __future__ import annotations

import logging
import threading

import pytest

from semel.eos import (OK, CommitAborted, CommitFatal, CommitSucceeded, Decision, EosMetrics, EosRuntime, Fatal,
                       Ledger, RecordingBroker, RecordingTxnBackend, RecoveryError, Retryable, RuntimeFailed,
                       SinkGuard, SinkTxnId, Step, decide, recover)
from semel.eos.runtime import check_interval
from semel.eos.sinks.http_echo import HttpEchoSink
from semel.eos.sinks.memory import MemorySink, MemorySinkState
from semel.eos.testing import RELEASE_HANGS, FaultySink


# ---------------------------------------------------------------- txn ids

def test_txn_id_round_trip_and_prefix():
    tid = SinkTxnId("orders", "i_1.a", 42)
    assert str(tid) == "orders-i_1.a-42"
    assert SinkTxnId.parse("orders-i_1.a-42") == tid
    assert tid.prefix == "orders-i_1.a-"


@pytest.mark.parametrize("app,inst,cycle", [("a-b", "0", 1), ("", "0", 1), ("a", "x/y", 1), ("a", "0", -1),
                                            ("a" * 65, "0", 1), ("..", "0", 1), ("a", "0", True)])
def test_txn_id_rejects_bad_parts(app, inst, cycle):
    with pytest.raises(ValueError):
        SinkTxnId(app, inst, cycle)


@pytest.mark.parametrize("text", ["a-0", "a-0-x", "a-0-1-2", "a-0--1", "a-0-１", 7])
def test_txn_id_parse_rejects_garbage(text):
    with pytest.raises(ValueError):
        SinkTxnId.parse(text)


# ---------------------------------------------------------------- ledger and decisions

def test_ledger_metadata_round_trip_is_bound_to_the_transactional_id():
    text = Ledger(7, 3).encode("app-0")
    assert Ledger.decode(text, "app-0") == Ledger(7, 3)
    assert Ledger.decode(text, "app-1") is None
    assert Ledger.decode("", "app-0") is None and Ledger.decode(None, "app-0") is None
    assert Ledger.decode("semel-eos/1 t=app-0 c=x h=0", "app-0") is None


@pytest.mark.parametrize("cycle,ledger,want", [
    (5, Ledger(5), Decision.COMMIT),
    (6, Ledger(5), Decision.ABORT),       # never reached the broker commit
    (4, Ledger(5), Decision.ABORT),       # an older aborted cycle whose sink abort failed
    (1, Ledger(0), Decision.ABORT),       # nothing ever committed
    (0, Ledger(0), Decision.ABORT),
    (3, Ledger(5, hold=3), Decision.UNDECIDED),
    (4, Ledger(5, hold=3), Decision.UNDECIDED),
    (2, Ledger(5, hold=3), Decision.ABORT),
    (5, Ledger(5, hold=3), Decision.COMMIT),
    (5, None, Decision.UNDECIDED),
    (None, Ledger(5), Decision.UNDECIDED),
])
def test_decide(cycle, ledger, want):
    assert decide(cycle, ledger) is want


# ---------------------------------------------------------------- the guard

class Weird(MemorySink):
    def __init__(self, answer=None, exc=None, hang=None):
        # A timeout only where a hang is scripted: a slow machine must not turn a plain call into one.
        super().__init__("weird", timeout=0.2 if hang is not None else None)
        self.answer, self.exc, self.hang = answer, exc, hang

    def prepare(self, txn_id, rows=()):
        if self.hang is not None:
            self.hang.wait(10)
        if self.exc is not None:
            raise self.exc
        return self.answer


@pytest.mark.parametrize("sink,cls,text", [
    (Weird(answer=OK), type(OK), None),
    (Weird(answer=Retryable("busy")), Retryable, "busy"),
    (Weird(answer=Fatal("broken")), Fatal, "broken"),
    (Weird(answer="yes"), Fatal, "garbage"),
    (Weird(answer=None), Fatal, "garbage"),
    (Weird(exc=OSError("disk gone")), Retryable, "OSError: disk gone"),
])
def test_guard_turns_answers_into_outcomes(sink, cls, text, caplog):
    guard = SinkGuard(sink)
    with caplog.at_level(logging.WARNING, logger="semel.eos"):
        outcome = guard.prepare("app-0-9", [])
    assert type(outcome) is cls
    if text is None:
        assert caplog.records == []
    else:
        assert text in outcome.reason
        # exactly one log line, naming sink, step and txn id
        assert len(caplog.records) == 1
        line = caplog.records[0].getMessage()
        assert "sink=weird" in line and "step=preCommit2PC" in line and "txn=app-0-9" in line


def test_guard_times_out_a_hanging_sink_and_reports_it_stuck():
    release = threading.Event()
    guard = SinkGuard(Weird(answer=OK, hang=release))
    outcome = guard.prepare("app-0-1", [])
    assert isinstance(outcome, Retryable) and "timed out after 0.2s" in outcome.reason
    assert guard.stuck
    release.set()
    for _ in range(100):
        if not guard.stuck:
            break
        threading.Event().wait(0.05)
    assert not guard.stuck


def test_guard_recover_garbage_and_errors():
    class R(MemorySink):
        def __init__(self, value):
            super().__init__("r")
            self.value = value

        def recover(self):
            if isinstance(self.value, Exception):
                raise self.value
            return self.value

    assert SinkGuard(R(["b", "a", "a"])).recover().ids == ("a", "b")
    assert isinstance(SinkGuard(R([1, 2])).recover().failure, Fatal)
    assert isinstance(SinkGuard(R("a-0-1")).recover().failure, Fatal)
    assert isinstance(SinkGuard(R(OSError("x"))).recover().failure, Retryable)


# ---------------------------------------------------------------- sinks: memory and http echo idempotence

def test_memory_sink_contract_idempotence():
    s = MemorySink()
    s.stage(1)
    assert s.prepare("t-0-1", [2]) is OK
    assert s.prepare("t-0-1") is OK                 # repeat: already prepared
    s.stage(3)
    assert isinstance(s.prepare("t-0-1"), Fatal)    # repeat carrying new rows would lose them
    assert s.commit("t-0-1") is OK and s.commit("t-0-1") is OK
    assert isinstance(s.abort("t-0-1"), Fatal)      # cannot abort a committed batch
    assert isinstance(s.commit("t-0-2"), Fatal)     # nothing prepared
    assert s.abort("t-0-2") is OK and s.abort("t-0-2") is OK
    assert s.state.committed == {"t-0-1": [1, 2]}
    assert s.staged == []                            # abort drops staged rows too


def test_http_echo_sink_delivers_whole_batch_once_per_success():
    got = []
    fail = [True]

    def on_commit(txn_id, rows):
        if fail[0]:
            fail[0] = False
            raise ConnectionError("endpoint down")
        got.append((txn_id, rows))

    s = HttpEchoSink(on_commit)
    for r in ("a", "b"):
        s.stage(r)
    assert s.prepare("t-0-1") is OK
    out = s.commit("t-0-1")
    assert isinstance(out, Retryable) and "endpoint down" in out.reason
    assert s.recover() == ["t-0-1"]                  # still prepared after the failed delivery
    assert s.commit("t-0-1") is OK and s.commit("t-0-1") is OK
    assert got == [("t-0-1", ["a", "b"])]


# ---------------------------------------------------------------- recovery rules

def _guards(*sinks):
    return [SinkGuard(s) for s in sinks]


def test_recovery_commits_aborts_and_skips_foreign_ids():
    st_ = MemorySinkState(prepared={"app-0-5": [1], "app-0-6": [2], "app-0-3": [0], "other-0-5": [9],
                                    "app-1-5": [8]})
    metrics = EosMetrics()
    report = recover("app", "0", Ledger(5), _guards(MemorySink("m", st_)), metrics)
    assert st_.committed == {"app-0-5": [1]}
    assert set(st_.prepared) == {"other-0-5", "app-1-5"}
    assert {(a.txn_id, str(a.decision)) for a in report.actions} == {
        ("app-0-5", "commit"), ("app-0-6", "abort"), ("app-0-3", "abort")}
    assert set(report.foreign) == {("m", "other-0-5"), ("m", "app-1-5")}
    assert report.next_cycle == 7
    assert metrics.value("semel_eos_recovery_decisions_total", {"participant": "m", "decision": "abort"}) == 2


def test_recovery_leaves_undecided_with_warning_and_metric(caplog):
    st_ = MemorySinkState(prepared={"app-0-x": [1], "app-0-4": [2]})
    metrics = EosMetrics()
    with caplog.at_level(logging.WARNING, logger="semel.eos"):
        report = recover("app", "0", Ledger(6, hold=4), _guards(MemorySink("m", st_)), metrics)
    assert set(st_.prepared) == {"app-0-x", "app-0-4"}          # left as is
    assert [str(a.decision) for a in report.actions] == ["undecided", "undecided"]
    assert metrics.value("semel_eos_recovery_undecided", {"participant": "m"}) == 2
    assert sum("undecided" in r.getMessage() for r in caplog.records) == 2
    assert report.hold == 4                                      # carried forward in the next ledger


def test_recovery_refuses_to_start_without_a_ledger_unless_overridden():
    st_ = MemorySinkState(prepared={"app-0-3": [1]})
    with pytest.raises(RecoveryError, match="no semel ledger"):
        recover("app", "0", None, _guards(MemorySink("m", st_)))
    report = recover("app", "0", None, _guards(MemorySink("m", st_)), first_cycle=10)
    assert report.next_cycle == 10 and report.hold == 3
    assert "app-0-3" in st_.prepared


def test_recovery_fails_when_a_sink_cannot_list_or_a_commit_fails():
    with pytest.raises(RecoveryError, match="cannot list"):
        recover("app", "0", Ledger(1), _guards(FaultySink(MemorySink("m"), {"recover": "raise"}, timeout=None)))
    st_ = MemorySinkState(prepared={"app-0-5": [1]})
    with pytest.raises(RecoveryError, match="could not finish committed") as info:
        recover("app", "0", Ledger(5), _guards(FaultySink(MemorySink("m", st_), {"commit": "retryable"},
                                                          timeout=None)))
    assert info.value.report is not None and "app-0-5" in st_.prepared


# ---------------------------------------------------------------- runtime

@pytest.mark.parametrize("bad", [0.05, 301, -1, "30", None, float("nan"), True])
def test_commit_interval_bounds(bad):
    with pytest.raises(ValueError, match="commit_interval"):
        check_interval(bad)


@pytest.mark.parametrize("good", [0.1, 30, 300])
def test_commit_interval_accepts_the_documented_range(good):
    assert check_interval(good) == good


def test_runtime_rejects_duplicate_sink_names_and_unstarted_use():
    backend = RecordingTxnBackend(RecordingBroker())
    with pytest.raises(ValueError, match="unique"):
        EosRuntime("app", "0", backend, [MemorySink("a"), MemorySink("a")])
    rt = EosRuntime("app", "0", backend, [MemorySink("a")])
    with pytest.raises(RuntimeFailed, match="start"):
        rt.run_cycle()


def test_runtime_stops_after_commit_fatal_and_numbers_cycles_from_the_ledger():
    broker = RecordingBroker(inputs=[1, 2, 3])
    backend = RecordingTxnBackend(broker, "app-0")
    rt = EosRuntime("app", "0", backend, [MemorySink("a")], commit_interval=0.1)
    assert rt.start().next_cycle == 1
    assert isinstance(rt.run_cycle(), CommitSucceeded)
    backend.fail("begin_txn")
    out = rt.run_cycle()
    assert isinstance(out, CommitFatal) and out.step is Step.BEGIN_TXN
    with pytest.raises(RuntimeFailed):
        rt.run_cycle()
    rt2 = EosRuntime("app", "0", RecordingTxnBackend(broker, "app-0"), [MemorySink("a")])
    assert rt2.start().next_cycle == 2


def test_runtime_fails_the_next_begin_while_a_sink_abort_keeps_failing():
    state = MemorySinkState()
    sink = FaultySink(MemorySink("a", state), timeout=None)
    backend = RecordingTxnBackend(RecordingBroker(inputs=[1, 2, 3]), "app-0")
    rt = EosRuntime("app", "0", backend, [sink], commit_interval=0.1)
    rt.start()
    backend.fail("flush")
    sink.faults["abort"] = "raise"

    def work(ctx):
        ctx.stage("a", "row")
    out = rt.run_cycle(work)
    assert isinstance(out, CommitAborted) and out.stranded == ("a",)
    assert rt.pending_aborts == {"a": {"app-0-1"}}
    sink.faults["abort"] = "raise"                 # the retry at the next begin fails too
    out = rt.run_cycle(work)
    assert isinstance(out, CommitFatal) and out.step is Step.BEGIN_TXN and "abort still failing" in out.reason
    assert backend.broker.open == {}                 # never began a broker transaction


def test_runtime_retries_a_failed_abort_before_the_next_cycle():
    state = MemorySinkState()
    sink = FaultySink(MemorySink("a", state), timeout=None)
    backend = RecordingTxnBackend(RecordingBroker(), "app-0")
    rt = EosRuntime("app", "0", backend, [sink], commit_interval=0.1)
    rt.start()
    backend.fail("commit_offsets")
    sink.faults["abort"] = "retryable"
    rt.run_cycle(lambda ctx: ctx.stage("a", "old"))
    assert isinstance(rt.run_cycle(lambda ctx: ctx.stage("a", "new")), CommitSucceeded)
    assert state.committed == {"app-0-2": ["new"]}   # the aborted cycle's row did not leak
    assert rt.pending_aborts == {}


def test_runtime_stage_to_unknown_sink_aborts_the_cycle():
    rt = EosRuntime("app", "0", RecordingTxnBackend(RecordingBroker()), [MemorySink("a")], commit_interval=0.1)
    rt.start()
    out = rt.run_cycle(lambda ctx: ctx.stage("nope", 1))
    assert isinstance(out, CommitAborted) and out.step is Step.FLUSH and "no sink named 'nope'" in out.reason


def test_metrics_count_outcomes_and_sink_latency():
    metrics = EosMetrics()
    backend = RecordingTxnBackend(RecordingBroker(), "app-0")
    rt = EosRuntime("app", "0", backend, [MemorySink("a")], commit_interval=0.1, metrics=metrics)
    rt.start()
    rt.run_cycle()
    backend.fail("commit_txn")
    rt.run_cycle()
    backend.fail("commit_txn", after=True)
    rt.run_cycle()
    v = metrics.value
    assert v("semel_eos_cycles_total", {"outcome": "succeeded", "step": "none"}) == 1
    assert v("semel_eos_cycles_total", {"outcome": "aborted", "step": "commitTxn"}) == 1
    assert v("semel_eos_cycles_total", {"outcome": "fatal", "step": "commitTxn"}) == 1
    assert v("semel_eos_sink_prepare_seconds_count", {"sink": "a"}) == 3
    assert v("semel_eos_sink_commit_seconds_count", {"sink": "a"}) == 1
    assert v("semel_eos_cycle_duration_seconds_count", {"outcome": "succeeded"}) == 1
    assert v("semel_eos_last_committed_cycle") == 1


def test_fault_spec_validation():
    with pytest.raises(ValueError):
        FaultySink(MemorySink(), {"prepare": "explode"})
    with pytest.raises(ValueError):
        RecordingTxnBackend().fail("commit")


@pytest.fixture(autouse=True, scope="module")
def _release():
    yield
    RELEASE_HANGS.set()


class _Clock:
    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now


@pytest.mark.parametrize("interval,per_cycle", [(0.125, 2), (30, 480), (300, 4800)])
def test_run_gives_each_cycle_exactly_its_interval_of_processing(monkeypatch, interval, per_cycle):
    """A fake clock: every poll takes 1/16 s (exact in binary), so a cycle processes interval * 16 records."""
    import semel.eos.runtime as runtime_mod
    clock = _Clock()
    monkeypatch.setattr(runtime_mod.time, "monotonic", clock.monotonic)
    broker = RecordingBroker(inputs=list(range(per_cycle * 3)))
    backend = RecordingTxnBackend(broker, "app-0")
    real_poll = backend.poll

    def slow_poll(timeout):
        clock.now += 0.0625
        return real_poll(0)
    backend.poll = slow_poll
    state = MemorySinkState()
    rt = EosRuntime("app", "0", backend, [MemorySink("a", state)], commit_interval=interval)
    rt.start()
    rt.run(lambda rec, ctx: ctx.stage("a", rec.value), max_cycles=3)
    assert [len(rows) for rows in state.committed.values()] == [per_cycle] * 3


def test_run_stops_when_asked_and_commits_the_partial_cycle():
    broker = RecordingBroker(inputs=list(range(10)))
    backend = RecordingTxnBackend(broker, "app-0")
    state = MemorySinkState()
    rt = EosRuntime("app", "0", backend, [MemorySink("a", state)], commit_interval=300)
    rt.start()
    seen = []

    def process(rec, ctx):
        seen.append(rec.value)
        ctx.stage("a", rec.value)
    out = rt.run(process, stop=lambda: len(seen) >= 4)
    assert isinstance(out, CommitSucceeded) and state.committed_rows() == [0, 1, 2, 3]
    assert broker.position == 4


def test_the_old_coordinator_names_still_resolve_with_a_warning():
    import semel.eos
    import semel.eos.kafka
    for module, old, new in ((semel.eos, "EosCoordinator", semel.eos.TxnBackend),
                             (semel.eos, "RecordingCoordinator", semel.eos.RecordingTxnBackend),
                             (semel.eos, "CoordinatorError", semel.eos.BackendError),
                             (semel.eos.kafka, "KafkaCoordinator", semel.eos.kafka.KafkaTxnBackend)):
        with pytest.warns(DeprecationWarning, match=old):
            assert getattr(module, old) is new
    with pytest.raises(AttributeError):
        semel.eos.NoSuchThing

"""KafkaTxnBackend's deadlines on librdkafka calls (docs/librdkafka-restart-hang.md),
with a stand-in for confluent-kafka whose chosen call never returns: a stuck call becomes an
aborted cycle on a fresh producer, except a stuck commit, whose outcome is
unknown (CommitFatal, left to recovery). The real hang, on a real broker, is in
tests/integration/test_restart_txn_resume.py."""
from __future__ import annotations

import threading

import pytest

import semel.eos.kafka as ek
from semel.eos import CommitAborted, CommitFatal, CommitSucceeded, Step
from semel.eos.cycle import CycleParts, run_commit_cycle


class FakeProducer:
    """Records calls; `stuck` names the call that blocks until `release` is set."""
    made: list["FakeProducer"] = []
    stuck: str | None = None
    release = threading.Event()

    def __init__(self, config):
        self.config, self.calls = config, []
        FakeProducer.made.append(self)

    def _do(self, name):
        self.calls.append(name)
        if name == FakeProducer.stuck:
            FakeProducer.release.wait(30)

    def init_transactions(self, timeout):
        self._do("init")

    def begin_transaction(self):
        self._do("begin")

    def flush(self, timeout):
        self._do("flush")
        return 0

    def send_offsets_to_transaction(self, offsets, meta, timeout):
        self._do("send_offsets")

    def commit_transaction(self, timeout):
        self._do("commit")

    def abort_transaction(self, timeout):
        self._do("abort")

    def produce(self, *a, **kw):
        pass

    def poll(self, timeout):
        return 0


class FakeConsumer:
    def __init__(self, config):
        self.config = config

    def committed(self, parts, timeout):
        return [ek.TopicPartition(tp.topic, tp.partition, -1001) for tp in parts]

    def get_watermark_offsets(self, tp, timeout):
        return 0, 0

    def assign(self, parts):
        pass

    def consumer_group_metadata(self):
        return object()

    def close(self):
        pass


@pytest.fixture
def backend(monkeypatch):
    monkeypatch.setattr(ek, "Producer", FakeProducer)
    monkeypatch.setattr(ek, "Consumer", FakeConsumer)
    monkeypatch.setattr(ek, "DEADLINE_GRACE_S", 0.2)
    FakeProducer.made, FakeProducer.stuck = [], None
    FakeProducer.release = threading.Event()
    c = ek.KafkaTxnBackend("127.0.0.1:1", "app-0", [("in", 0)], timeout=0.1)
    c.init()
    yield c
    FakeProducer.release.set()   # let the abandoned calls end
    c.close()


def _cycle(c, n):
    return run_commit_cycle(n, f"app-0-{n}", CycleParts(c))


def test_clients_default_to_no_rebootstrap(backend):
    assert FakeProducer.made[0].config["metadata.recovery.strategy"] == "none"
    assert backend._consumer.config["metadata.recovery.strategy"] == "none"


@pytest.mark.parametrize("step,call", [(Step.FLUSH, "flush"), (Step.COMMIT_OFFSETS, "send_offsets")])
def test_a_stuck_call_aborts_the_cycle_on_a_fresh_producer(backend, step, call):
    FakeProducer.stuck = call
    outcome = _cycle(backend, 1)
    assert isinstance(outcome, CommitAborted) and outcome.step is step, outcome
    assert "abandoned" in outcome.reason
    first, second = FakeProducer.made
    assert first.calls[-1] == call and "abort" not in first.calls   # never touched again
    assert second.calls == ["init"]                                  # its init fenced the first
    FakeProducer.stuck = None
    assert isinstance(_cycle(backend, 2), CommitSucceeded)
    assert second.calls == ["init", "begin", "flush", "send_offsets", "commit"]


def test_a_stuck_commit_is_left_to_recovery(backend):
    FakeProducer.stuck = "commit"
    outcome = _cycle(backend, 1)
    assert isinstance(outcome, CommitFatal) and outcome.step is Step.COMMIT_TXN, outcome
    assert "outcome is unknown" in outcome.reason
    assert len(FakeProducer.made) == 1 and "abort" not in FakeProducer.made[0].calls


def test_a_wedged_producer_refuses_further_calls(backend):
    FakeProducer.stuck = "begin"
    with pytest.raises(ek.BackendError, match="abandoned"):
        backend.begin_txn(1)
    with pytest.raises(ek.BackendError, match="begin_txn is still stuck"):
        backend.flush(1)

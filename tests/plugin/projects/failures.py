"""An outside project's tests for the runs that go wrong (tests/plugin/test_failures.py
picks one with -k): a broker that cannot start, a failing test, an interrupted run.
PIDS_FILE (environment) receives the pid of every broker the test holds."""
import os
import time


def write_pids(*brokers):
    with open(os.environ["PIDS_FILE"], "w") as f:
        f.write(" ".join(str(b.pid) for b in brokers))


def test_needs_the_broker(semel_broker):
    assert semel_broker.alive()


def test_fails_holding_brokers(semel_broker, semel_broker_fresh):
    write_pids(semel_broker, semel_broker_fresh)
    assert False, "this test fails on purpose"


def test_interrupted_holding_brokers(semel_broker, semel_broker_fresh):
    write_pids(semel_broker, semel_broker_fresh)
    time.sleep(120)

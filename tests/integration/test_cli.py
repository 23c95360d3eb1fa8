"""The `semel` command as a user runs it: real processes, exit codes, one-line errors."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from semel.cli.main import SUBCOMMANDS
from tests.support.brokers import module_broker_fixture
from tests.support.cli_help import check_helps, help_code

# One broker for the module's tests that take `broker` (each uses its own topic names);
# the SIGTERM and flush-mode tests start their own.
broker = module_broker_fixture("cli", "--group-initial-rebalance-delay-ms", "0",
                               "--group-min-session-timeout-ms", "1000")


def semel(*args, input=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "semel", *args], input=input, capture_output=True,
                          text=True, timeout=timeout)


def test_help_on_every_subcommand():
    assert semel("--help").returncode == 0
    # The subcommands' parsers in one process (tests/support/cli_help.py), not one each.
    commands = [[name, "--help"] for name in SUBCOMMANDS] + [
        [*nested, "--help"] for nested in (("broker", "start"), ("topic", "create"), ("topic", "list"),
                                           ("topic", "describe"), ("topic", "delete"))]
    r = subprocess.run([sys.executable, "-c", help_code(commands)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    check_helps(r.stdout, r.stderr, commands)


def test_topic_produce_consume_round_trip(broker):
    b = ["--bootstrap", broker.bootstrap]
    r = semel("topic", "create", "cli", "--partitions", "2", "--config", "retention.ms=60000", *b)
    assert r.returncode == 0, r.stderr
    assert "cli\t2 partition(s)" in semel("topic", "list", *b).stdout
    r = semel("produce", "cli", "--key-separator", ":", "--header", "src=test", *b, input="k1:one\nk2:two\nk1:three\n")
    assert r.returncode == 0, r.stderr
    r = semel("consume", "cli", "--from-beginning", "--timeout", "2", "--print-keys", "--print-headers", *b)
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.splitlines())
    assert lines == ["k1\tsrc=test\tone", "k1\tsrc=test\tthree", "k2\tsrc=test\ttwo"]
    desc = semel("topic", "describe", "cli", *b).stdout
    assert "2 partition(s)" in desc
    assert semel("topic", "delete", "cli", *b).returncode == 0
    assert "cli\t" not in semel("topic", "list", *b).stdout


def test_transactional_produce_and_isolation(broker):
    b = ["--bootstrap", broker.bootstrap]
    semel("topic", "create", "tx", *b)
    r = semel("produce", "tx", "--transactional-id", "cli-tx", "--value", "a", "--value", "b", *b)
    assert r.returncode == 0, r.stderr
    r = semel("consume", "tx", "--from-beginning", "--timeout", "2", "--isolation", "read_committed", *b)
    assert sorted(r.stdout.split()) == ["a", "b"]


def test_errors_are_one_readable_line(broker):
    cases = [
        ("produce", "x", "--bootstrap", "127.0.0.1:1", "--value", "v"),
        ("consume", "x", "--bootstrap", "127.0.0.1:1", "--timeout", "1"),
        ("topic", "list", "--bootstrap", "not-an-address"),
        ("topic", "create", "bad name", "--bootstrap", broker.bootstrap),
        ("topic", "create", "ok", "--config", "nonsense", "--bootstrap", broker.bootstrap),
        ("topic", "create", "ok2", "--config", "no.such.config=1", "--bootstrap", broker.bootstrap),
        ("topic", "delete", "missing", "--bootstrap", broker.bootstrap),
        ("broker", "start", "--data-dir", "/proc/semel-cannot-write", "--port", "0"),
        ("broker", "start", "--data-dir", "/tmp/x", "--port", "70000"),
    ]
    for args in cases:
        r = semel(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        err_lines = [line for line in r.stderr.splitlines() if line.startswith("semel")]
        assert len(err_lines) == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_broker_stops_cleanly_on_sigterm(start_broker):
    b = start_broker()
    assert semel("topic", "create", "keep", "--bootstrap", b.bootstrap).returncode == 0
    semel("produce", "keep", "--value", "persisted", "--bootstrap", b.bootstrap)
    b.proc.send_signal(signal.SIGTERM)
    assert b.proc.wait(30) == 0
    b.start()
    r = semel("consume", "keep", "--from-beginning", "--timeout", "2", "--bootstrap", b.bootstrap)
    assert r.stdout.split() == ["persisted"]


@pytest.mark.parametrize("flag", ["--flush-mode=interval", "--flush-mode=never"])
def test_flush_modes_serve_clients(start_broker, flag):
    b = start_broker(flag)
    assert semel("topic", "create", "fm", "--bootstrap", b.bootstrap).returncode == 0
    assert semel("produce", "fm", "--value", "x", "--bootstrap", b.bootstrap).returncode == 0
    r = semel("consume", "fm", "--from-beginning", "--timeout", "2", "--bootstrap", b.bootstrap)
    assert r.stdout.split() == ["x"]

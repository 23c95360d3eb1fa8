"""`semel topic alter` and `semel topic delete-records` as a user runs them:
real processes, exit codes, one readable line on errors."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.brokers import module_broker


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory):
    with module_broker(tmp_path_factory, "admin-cli") as b:
        yield b


def semel(*args):
    return subprocess.run([sys.executable, "-m", "semel", *args], capture_output=True, text=True, timeout=120)


def _one_line_error(r):
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_alter_partitions_and_configs(mbroker):
    b = ("--bootstrap", mbroker.bootstrap)
    assert semel("topic", "create", "alt", "--partitions", "1", *b).returncode == 0
    r = semel("topic", "alter", "alt", "--partitions", "3", "--config", "retention.ms=5000", *b)
    assert r.returncode == 0, r.stderr
    assert "alt\t3 partition(s)" in semel("topic", "list", *b).stdout
    assert "INVALID_PARTITIONS" in _one_line_error(semel("topic", "alter", "alt", "--partitions", "2", *b))
    assert "INVALID_CONFIG" in _one_line_error(semel("topic", "alter", "alt", "--config", "bogus.key=1", *b))
    assert "UNKNOWN_TOPIC_OR_PARTITION" in _one_line_error(
        semel("topic", "alter", "nope", "--config", "retention.ms=1", *b))
    assert semel("topic", "alter", "alt", "--delete-config", "retention.ms", *b).returncode == 0
    _one_line_error(semel("topic", "alter", "alt", *b))  # nothing to do is an error, not a no-op


def test_delete_records(mbroker):
    b = ("--bootstrap", mbroker.bootstrap)
    assert semel("topic", "create", "trim", "--partitions", "2", *b).returncode == 0
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": mbroker.bootstrap})
    for i in range(10):
        p.produce("trim", value=b"x", partition=i % 2)
    assert p.flush(30) == 0
    r = semel("topic", "delete-records", "trim", "--partition", "0", "--before", "3", *b)
    assert r.returncode == 0, r.stderr
    assert "trim-0: log start now 3" in r.stdout
    r = semel("topic", "delete-records", "trim", *b)  # every partition, up to the high watermark
    assert "trim-0: log start now 5" in r.stdout and "trim-1: log start now 5" in r.stdout
    desc = semel("topic", "describe", "trim", *b).stdout
    assert "0\t5\t5\t5" in desc and "1\t5\t5\t5" in desc
    assert "OFFSET_OUT_OF_RANGE" in _one_line_error(
        semel("topic", "delete-records", "trim", "--partition", "1", "--before", "99", *b))


def test_create_warns_about_dot_underscore_collision(mbroker):
    b = ("--bootstrap", mbroker.bootstrap)
    r = semel("topic", "create", "metrics.in", *b)
    assert r.returncode == 0 and "warning:" in r.stderr and "'.' and '_'" in r.stderr
    r = semel("topic", "create", "plainname", *b)
    assert "warning" not in r.stderr and "1 partition(s), replication factor 1" in r.stdout  # the default, named
    r = semel("topic", "create", "metrics_in", *b)  # warned, then refused by the broker
    assert r.returncode != 0 and "INVALID_TOPIC_EXCEPTION" in r.stderr.splitlines()[-1]

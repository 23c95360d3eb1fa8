"""The consume-transform-produce example under SIGKILLs, as a user would run it.

examples/double_chaos.py starts examples/double.py (an unmodified confluent-kafka
consumer + transactional producer), SIGKILLs it at random moments, restarts it,
and checks that every input n appears exactly once as 2n under read_committed.
Here it runs against a real semel broker process; on top of its own verdict the
test checks that the kills happened, that every input was consumed (the group's
committed offsets reached the end of the input) and that nothing is left open.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from semel.client import Client

ROOT = Path(__file__).resolve().parents[2]
INPUTS, KILLS, PARTITIONS = 1500, 4, 3


def load_example():
    spec = importlib.util.spec_from_file_location("double_chaos", ROOT / "examples" / "double_chaos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [7])
def test_double_chaos_example_reports_exactly_once(start_broker, seed):
    from confluent_kafka import Consumer, TopicPartition
    broker = start_broker("--group-initial-rebalance-delay-ms", "0", "--group-min-session-timeout-ms", "1000")
    example = load_example()
    lines: list[str] = []
    problems = example.run(broker.bootstrap, INPUTS, KILLS, seed, partitions=PARTITIONS, log=lines.append)
    assert problems == []
    assert sum(1 for line in lines if "SIGKILLed the worker" in line) == KILLS
    assert f"{INPUTS} inputs, {INPUTS} committed outputs" in lines
    with Client(broker.bootstrap) as c:
        ends = [c.list_offset("numbers", p, -1) for p in range(PARTITIONS)]
        assert sum(ends) == INPUTS
        for p in range(PARTITIONS):     # no transaction of a killed worker left open
            assert c.list_offset("doubled", p, -1, isolation=1) == c.list_offset("doubled", p, -1)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "doubler"})
    try:
        committed = consumer.committed([TopicPartition("numbers", p) for p in range(PARTITIONS)], timeout=15)
    finally:
        consumer.close()
    assert [tp.offset for tp in committed] == ends

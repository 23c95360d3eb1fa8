"""`semel topic reassign`'s plans (semel.cli.topic_reassign): Kafka's JSON both ways,
refusals in one line, and --generate's spread."""
from __future__ import annotations

from collections import Counter

import pytest

from semel.cli.main import CliError
from semel.cli.topic_reassign import parse_plan, plan_json, spread


def test_plan_json_round_trips_in_kafkas_format():
    plan = {("a", 1): [2, 3], ("a", 0): [1, 2]}
    text = plan_json(plan)
    assert '"log_dirs": ["any", "any"]' in text and text.index('"partition": 0') < text.index('"partition": 1')
    assert parse_plan(text) == plan


@pytest.mark.parametrize("text", ["", "{}", '{"partitions": []}', '{"partitions": [{"topic": "a"}]}', "[1]"])
def test_a_bad_plan_is_one_readable_error(text):
    with pytest.raises(CliError):
        parse_plan(text)


def test_spread_is_even_over_the_brokers_across_topics():
    got = spread({"a": (6, 2), "b": (4, 2)}, [1, 2, 3, 4, 5])
    assert sorted(got) == [("a", p) for p in range(6)] + [("b", p) for p in range(4)]
    assert all(len(set(r)) == 2 for r in got.values())
    assert Counter(r[0] for r in got.values()) == {b: 2 for b in (1, 2, 3, 4, 5)}     # leaders
    assert Counter(b for r in got.values() for b in r) == {b: 4 for b in (1, 2, 3, 4, 5)}


def test_spread_refuses_more_replicas_than_brokers():
    with pytest.raises(CliError, match="only 2 brokers"):
        spread({"a": (1, 3)}, [1, 2])

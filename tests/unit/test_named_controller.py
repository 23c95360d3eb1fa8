"""The controller id Metadata and DescribeCluster answer when a broker knows none."""
from __future__ import annotations

from semel.broker.handlers.common import named_controller


class View:
    def __init__(self, brokers, controller):
        self._brokers, self._controller = {b: object() for b in brokers}, controller

    def brokers(self):
        return self._brokers

    def controller_id(self):
        return self._controller


def test_the_elected_controller_while_known():
    assert named_controller(View({0, 1, 2}, 0), node_id=0) == 0
    assert named_controller(View({0, 1, 2}, 2), node_id=0) == 2


def test_another_broker_than_itself_when_none_is_known():
    assert named_controller(View({0, 1, 2}, None), node_id=0) == 1
    assert named_controller(View({0, 1, 2}, None), node_id=1) == 0
    assert named_controller(View({2, 5}, None), node_id=5) == 2


def test_itself_when_alone_and_minus_one_only_knowing_no_broker():
    assert named_controller(View({3}, None), node_id=3) == 3
    assert named_controller(View(set(), None), node_id=3) == -1

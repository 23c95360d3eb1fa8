"""Spark fixtures: one local[2] SparkSession for the whole Spark test session
(start-up costs ~10 s and ~2 GB), and one semel broker per test module."""
from __future__ import annotations

import pytest

from tests.support.brokers import module_broker
from tests.support.markers import starts_processes

# The Spark tests' brokers rebalance groups at once (no initial delay).
FAST_GROUPS = ("--group-initial-rebalance-delay-ms", "0")


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from semel.spark import local_session

    session = local_session("local[2]", "semel-tests", tmp_path_factory.mktemp("spark-local"))
    yield session
    session.stop()


@pytest.fixture(scope="module")
@starts_processes
def spark_broker(tmp_path_factory):
    """A semel broker shared by one test module (tests use their own topics)."""
    with module_broker(tmp_path_factory, "spark-broker", *FAST_GROUPS) as b:
        yield b

"""Spark fixtures: one local[2] SparkSession for the whole Spark test session
(start-up costs ~10 s and ~2 GB), and one semel broker per test module."""
from __future__ import annotations

import os
import sys

import pytest

from semel.cli.process import SemelBroker


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    # The Python workers must run the venv's interpreter (semel and its
    # dependencies live there), never whatever `python3` is first on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from semel.spark import register

    local = tmp_path_factory.mktemp("spark-local")
    session = (SparkSession.builder.master("local[2]").appName("semel-tests")
               .config("spark.local.dir", str(local))
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "1g")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


def module_broker(tmp_path_factory, name: str, *extra_args: str) -> SemelBroker:
    """A started semel broker for one test module; extra_args for what a module needs."""
    d = tmp_path_factory.mktemp(name)
    b = SemelBroker(d / "data", extra_args=["--group-initial-rebalance-delay-ms", "0", *extra_args],
                    log_path=d / "broker.log")
    b.start()
    return b


@pytest.fixture(scope="module")
def spark_broker(tmp_path_factory):
    """A semel broker shared by one test module (tests use their own topics)."""
    b = module_broker(tmp_path_factory, "spark-broker")
    yield b
    b.close()

"""semel.spark.advice on a checkpoint directory laid out as Spark lays it out: the
many-tasks warning is logged once per query and run, for a stateful query only, and
an Append query's is decided once its state exists. (The warning from a real query's
driver: tests/spark/test_sink_advice.py.)"""
from __future__ import annotations

import logging

from semel.spark.advice import MANY_TASKS, warn_many_tasks
from semel.spark.checkpoint import shuffle_partitions


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "semel.spark"]


def test_complete_mode_warns_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "semel.spark")
    group = f"g-{tmp_path.name}"
    for batch in (0, 0, 1):
        warn_many_tasks(group, str(tmp_path), {}, batch, MANY_TASKS + 1, complete=True)
    assert len(warnings(caplog)) == 1
    assert f"from {MANY_TASKS + 1} Python tasks" in warnings(caplog)[0]
    assert "write_each_batch" in warnings(caplog)[0]


def test_append_mode_waits_for_its_state(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "semel.spark")
    group = f"g-{tmp_path.name}"
    warn_many_tasks(group, str(tmp_path), {}, 0, 200, complete=False)
    warn_many_tasks(group, str(tmp_path), {}, 1, 200, complete=False)   # no state/: no aggregation
    assert warnings(caplog) == []
    other = tmp_path / "stateful"
    (other / "state").mkdir(parents=True)
    warn_many_tasks(group + "-2", str(other), {}, 1, 200, complete=False)
    assert len(warnings(caplog)) == 1


def test_few_tasks_do_not_warn(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "semel.spark")
    warn_many_tasks(f"g-{tmp_path.name}", str(tmp_path), {}, 0, MANY_TASKS, complete=True)
    assert warnings(caplog) == []


def test_shuffle_partitions_from_an_offset_log_entry():
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{"spark.sql.shuffle.partitions":"200"}}'
    assert shuffle_partitions(["v1", meta, '{"in":{"0":5}}']) == 200
    assert shuffle_partitions(["v1", "{}"]) is None and shuffle_partitions(None) is None

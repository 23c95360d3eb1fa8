"""The sink's diagnostic phase trace (SEMEL_SPARK_SINK_TRACE), which the Spark pipeline
benchmark joins with Spark's progress: one JSON line per write()/commit(), none unset."""
from __future__ import annotations

import json

from semel.spark import sink

from semel.spark import sink_options

from semel.spark import trace as spark_trace


def options() -> sink_options.SinkOptions:
    return sink.parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "semel.query.id": "q1", "topic": "out"})


def test_phases_are_one_json_line_per_call(tmp_path, monkeypatch):
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(spark_trace.TRACE_ENV, str(path))
    for batch in (3, 4):
        ph = spark_trace.Phases(options(), "commit", batch)
        ph.mark("read_decision")
        ph.mark("end_txn")
        ph.done(branches=2)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [d["batch"] for d in lines] == [3, 4]
    for d in lines:
        assert d["query"] == "q1" and d["where"] == "commit" and d["branches"] == 2
        assert d["read_decision"] >= 0 and d["end_txn"] >= 0 and d["end"] >= d["start"]
        assert 0 <= d["cpu_ms"] <= (d["end"] - d["start"]) * 1000 + 1   # the thread's CPU within its wall time


def test_nothing_is_written_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(spark_trace.TRACE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    ph = spark_trace.Phases(options(), "write p0 a0", 1)
    ph.mark("check")
    ph.done(rows=5)
    assert list(tmp_path.iterdir()) == []
    assert "check" not in ph.doc


def test_waits_for_the_input_are_summed_apart(tmp_path, monkeypatch):
    """A task's waits for its next Arrow batch (Spark's share of the task) are added up
    as input_wait_ms; each traced call is numbered within its process."""
    import time
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(spark_trace.TRACE_ENV, str(path))

    def slow():
        for i in range(3):
            time.sleep(0.02)
            yield i
    ph = spark_trace.Phases(options(), "write p0 a0", 1)
    assert list(ph.waited(slow())) == [0, 1, 2]
    ph.done()
    spark_trace.Phases(options(), "write p1 a0", 1).done()
    first, second = (json.loads(x) for x in path.read_text().splitlines())
    assert first["input_wait_ms"] >= 60 and "input_wait_ms" not in second
    assert second["call"] == first["call"] + 1

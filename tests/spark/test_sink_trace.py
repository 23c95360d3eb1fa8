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


def test_nothing_is_written_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(spark_trace.TRACE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    ph = spark_trace.Phases(options(), "write p0 a0", 1)
    ph.mark("check")
    ph.done(rows=5)
    assert list(tmp_path.iterdir()) == []
    assert "check" not in ph.doc

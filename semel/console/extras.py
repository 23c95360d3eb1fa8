"""What the console shows beside the cluster: a Spark job's lag listener and a
`semel check` report. Both are read from files and endpoints their programs write,
each as a plain dict the page template reads; a missing or unreadable one is a
dict with an "error" in words, never an exception.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

SPARK_PREFIX = "semel_spark_"
TIMELINE_BUCKET_S = 1.0


def spark_metrics(endpoint: str) -> dict:
    """The queries a LagListener (semel.spark.metrics) publishes at its Prometheus
    endpoint: {"queries": [{query, source, min, max, avg, partitions: [(topic, p, behind)]}]}."""
    url = endpoint if "://" in endpoint else f"http://{endpoint}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {"endpoint": url, "error": f"cannot read {url}: {getattr(exc, 'reason', exc)}", "queries": []}
    queries: dict[str, dict] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.startswith(SPARK_PREFIX):
                continue
            q = queries.setdefault(s.labels.get("query", "?"), {"query": s.labels.get("query", "?"), "sources": {},
                                                                 "partitions": []})
            what = s.name[len(SPARK_PREFIX):]
            if what == "partition_offsets_behind_latest":
                q["partitions"].append((s.labels.get("topic", "?"), int(s.labels.get("partition", -1)),
                                        int(s.value)))
            elif what.endswith("_offsets_behind_latest"):
                src = q["sources"].setdefault(s.labels.get("source", "?"), {})
                src[what.split("_", 1)[0]] = s.value
    for q in queries.values():
        q["partitions"].sort()
    return {"endpoint": url, "error": "", "queries": sorted(queries.values(), key=lambda q: q["query"])}


def check_report(out_dir: Path) -> dict:
    """A `semel check` run: its verdict and counts (summary.json), its report text, and
    a timeline from history.jsonl (completed operations per second by outcome, the
    faults injected, and the anomalies that name a time)."""
    out: dict = {"dir": str(out_dir), "error": "", "summary": None, "report": "", "timeline": None}
    summary = out_dir / "summary.json"
    try:
        out["summary"] = json.loads(summary.read_text())
    except (OSError, ValueError) as exc:
        out["error"] = f"no readable summary.json in {out_dir} ({exc.__class__.__name__}): has the run finished?"
    try:
        out["report"] = (out_dir / "report.txt").read_text()
    except OSError:
        pass
    history = out_dir / "history.jsonl"
    if history.exists():
        out["timeline"] = timeline(history, out["summary"] or {})
    elif not out["error"]:
        out["error"] = f"no history.jsonl in {out_dir}"
    return out


def timeline(history: Path, summary: dict) -> dict:
    """{"t": [...s], "ok": [...], "fail": [...], "info": [...], "faults": [(s, text)], "anomalies": [(s, name)]}."""
    counts: dict[str, Counter] = {"ok": Counter(), "fail": Counter(), "info": Counter()}
    faults = []
    with open(history) as fh:
        for line in fh:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            t = ev.get("time", 0) / 1e9
            if ev.get("process") == "nemesis":
                if ev.get("type") == "invoke":   # a fault begins (its info event is the heal)
                    faults.append((round(t, 2), _fault_text(ev.get("f"), ev.get("value"))))
                continue
            if ev.get("type") in counts:
                counts[ev["type"]][int(t // TIMELINE_BUCKET_S)] += 1
    last = max((max(c) for c in counts.values() if c), default=0)
    # An anomaly case is placed at the first operation it names.
    anomalies = sorted((round(min(times), 2), name) for name, cases in (summary.get("anomalies") or {}).items()
                       for case in cases if (times := _times(case)))
    return {"t": [b * TIMELINE_BUCKET_S for b in range(last + 1)],
            **{k: [c.get(b, 0) for b in range(last + 1)] for k, c in counts.items()},
            "faults": faults, "anomalies": anomalies}


def _fault_text(name, value) -> str:
    if isinstance(value, dict):
        return " ".join([str(name)] + [f"{k}={v}" for k, v in value.items()])
    return f"{name} {value}" if value not in (None, "") else str(name)


def _times(case) -> list[float]:
    """The times (s) of the operations an anomaly case names."""
    found = []
    if isinstance(case, dict):
        if "time" in case and "index" in case:
            found.append(case["time"] / 1e9)
        for v in case.values():
            found += _times(v)
    elif isinstance(case, list):
        for v in case:
            found += _times(v)
    return found

"""docs/grafana/semel.json asks Prometheus only for what semel exports: every metric
name in its queries is one the broker declares (semel/broker/metrics.py: its counters,
histograms and the gauges its collector yields at scrape; request_times.py: the request
latency histograms) or one the Spark lag
listener declares (semel/spark/metrics.py); and every label a query groups, matches
or names a series by is one that metric carries."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "semel.json"
NAME = re.compile(r"\bsemel_[a-z0-9_]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


CONSTRUCTORS = {"Counter", "Gauge", "Histogram", "GaugeMetricFamily", "HistogramMetricFamily"}


def _declared(path: Path) -> dict[str, set[str]]:
    """{name: label names} of the metrics a module declares (its prometheus_client
    constructors; the scrape-time gauges appear only on a live broker, their
    declarations are what it exports)."""
    tree = ast.parse(path.read_text())
    lists = {t.id: n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.List)
             for t in n.targets if isinstance(t, ast.Name)}
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in CONSTRUCTORS and node.args:
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            labels = next((kw.value for kw in node.keywords if kw.arg in ("labels", "labelnames")),
                          node.args[2] if len(node.args) > 2 else None)
            if isinstance(labels, ast.Name):
                labels = lists.get(labels.id)
            out[first.value] = {e.value for e in getattr(labels, "elts", ()) if isinstance(e, ast.Constant)}
    return out


def exported() -> dict[str, set[str]]:
    out = _declared(ROOT / "semel" / "broker" / "metrics.py") | _declared(ROOT / "semel" / "broker" / "request_times.py")
    assert {"semel_requests_total", "semel_partition_lso_gap"} <= set(out), sorted(out)
    spark = _declared(ROOT / "semel" / "spark" / "metrics.py")
    assert spark, "the Spark lag listener's gauges were not found"
    return out | spark


def _queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", ())]


def test_every_metric_in_the_dashboard_is_exported():
    names = exported()
    used = {m for q in _queries() for m in NAME.findall(q)}
    assert len(used) >= 15, used
    missing = sorted(m for m in used if m not in names
                     and not (m.endswith(HISTOGRAM_SUFFIXES) and m.rsplit("_", 1)[0] in names))
    assert not missing, f"not exported by semel: {missing}"


def test_every_label_a_query_uses_is_carried_by_its_metrics():
    names = exported()
    for q in _queries():
        metrics = [base for m in NAME.findall(q) for base in (m, m.rsplit("_", 1)[0]) if base in names]
        labels = {x.strip() for group in re.findall(r"(?:by|on) \(([^)]*)\)", q) for x in group.split(",")} - {"le"}
        labels |= set(re.findall(r"\{\{(\w+)\}\}", q))
        carried = set().union(*(names[m] for m in metrics)) if metrics else set()
        assert labels <= carried, f"{q}: labels {sorted(labels - carried)} on none of {metrics}"


def test_dashboard_covers_transactions_lso_gap_lag_and_replication():
    text = " ".join(_queries())
    for needed in ("semel_transactions_active", "semel_transactions_timed_out_total", "semel_partition_lso_gap",
                   "semel_spark_max_offsets_behind_latest", "semel_under_replicated_partitions",
                   "semel_partition_isr_size"):
        assert needed in text, needed

"""Pieces of bench.latency_bench: percentiles, the broker's request-latency histograms
(scraped before and after a point, their difference read by stage) and the targets."""
from __future__ import annotations

import math
import urllib.request

PERCENTILES = (("p50", 0.50), ("p99", 0.99), ("p99_9", 0.999))


def summary_ms(seconds: list[float]) -> dict:
    """p50/p99/p99.9/max (and count) in milliseconds of latencies given in seconds."""
    if not seconds:
        return {"count": 0}
    xs = sorted(seconds)
    out: dict = {"count": len(xs)}
    for name, q in PERCENTILES:
        out[name] = round(xs[max(0, math.ceil(q * len(xs)) - 1)] * 1000, 2)
    out["max"] = round(xs[-1] * 1000, 2)
    return out


# --- the broker's own histograms (semel.broker.request_times) ------------------------------

def scrape(ports: list[int]) -> dict:
    """{(name, labels): value} of semel brokers' /metrics, summed over the brokers (a
    cluster's leaders are spread over them); a broker that does not answer adds nothing."""
    from prometheus_client.parser import text_string_to_metric_families
    out: dict = {}
    for port in ports:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        except OSError:
            continue
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                out[key] = out.get(key, 0.0) + s.value
    return out


def _buckets(samples: dict, name: str, labels: dict) -> dict[float, float]:
    want = sorted(labels.items())
    return {float(dict(k)["le"]): v for (n, k), v in samples.items()
            if n == f"{name}_bucket" and sorted((a, b) for a, b in k if a != "le") == want}


def _quantile_ms(buckets: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding quantile q (ms): what a histogram can say."""
    total = buckets.get(math.inf, 0)
    if total <= 0:
        return None
    for le in sorted(buckets):
        if buckets[le] >= q * total:
            return round(le * 1000, 3) if le != math.inf else None
    return None


def _delta_histogram(before: dict, after: dict, name: str, labels: dict) -> tuple[dict, float, float]:
    a, b = _buckets(after, name, labels), _buckets(before, name, labels)
    key = tuple(sorted(labels.items()))
    count = after.get((f"{name}_count", key), 0) - before.get((f"{name}_count", key), 0)
    total = after.get((f"{name}_sum", key), 0) - before.get((f"{name}_sum", key), 0)
    return {le: v - b.get(le, 0) for le, v in a.items()}, count, total


STAGES = ("request_queue", "local", "response_queue", "remote", "send")
# The APIs a point's breakdown covers: Produce, Fetch, then the transactional ones.
APIS = ("produce", "fetch", "end_txn", "txn_offset_commit", "add_partitions_to_txn", "add_offsets_to_txn")


def breakdown(before: dict, after: dict, apis: tuple[str, ...]) -> dict:
    """Per API, the requests answered during the point: count, mean and the p50/p99 bucket
    bound (ms) of the total and of each stage; and the event loop's lag."""
    out: dict = {}
    for api in apis:
        buckets, count, total = _delta_histogram(before, after, "semel_request_seconds", {"api": api})
        if count <= 0:
            continue
        row = {"requests": int(count), "total": _stage_row(buckets, count, total)}
        for stage in STAGES:
            b, c, s = _delta_histogram(before, after, "semel_request_stage_seconds", {"api": api, "stage": stage})
            row[stage] = _stage_row(b, c, s)
        out[api] = row
    lag, count, total = _delta_histogram(before, after, "semel_event_loop_lag_seconds", {})
    if count > 0:
        out["event_loop_lag"] = _stage_row(lag, count, total)
    return out


def _stage_row(buckets: dict, count: float, total: float) -> dict:
    return {"mean_ms": round(total / count * 1000, 3), "p50_le_ms": _quantile_ms(buckets, 0.5),
            "p99_le_ms": _quantile_ms(buckets, 0.99)}


# --- targets -------------------------------------------------------------------------------

def _ratio(a, b):
    return round(a / b, 2) if a is not None and b else None


def targets(points: list[dict]) -> list[dict]:
    """Each target with the measured ratio (or value) and met/missed; a missed one carries
    `where_the_time_went`: the mean ms by stage of the semel point it is about (its
    Produce or, for transactions, every transactional API), from the broker's histograms."""
    def find(broker: str, workload: str) -> dict:
        return next((p for p in points if p["broker"] == broker and p["workload"] == workload), {})

    def pub(broker: str, workload: str, key: str):
        return find(broker, workload).get("publish_ms", {}).get(key)

    rows = []
    for wl in ("1KiB@5000", "1KiB@10000", "1KiB@20000"):
        always, point = pub("semel always", wl, "p99"), find("semel always", wl)
        rows.append(_target(f"{wl}: always p99 <= 1.5x interval p99", _ratio(always, pub("semel interval", wl, "p99")),
                            1.5, point))
        rows.append(_target(f"{wl}: always p99 <= Tansu p99", _ratio(always, pub("tansu", wl, "p99")), 1.0, point))
        rows.append(_target(f"{wl}: always p99.9 <= 2x Tansu p99.9",
                            _ratio(pub("semel always", wl, "p99_9"), pub("tansu", wl, "p99_9")), 2.0, point))
    for p in points:
        if p["broker"] == "semel rf3" and "publish_ms" in p:
            rows.append(_target(f"{p['workload']}: RF3 acks=all p99 <= 3x single-node always p99",
                                _ratio(p["publish_ms"].get("p99"), pub("semel always", p["workload"], "p99")), 3.0, p))
    for p in points:
        if p["broker"] == "semel always" and "e2e_ms" in p and "publish_ms" in p:
            rows.append(_target(f"{p['workload']}: always e2e read_committed p99 <= 2x publish p99",
                                _ratio(p["e2e_ms"].get("p99"), p["publish_ms"].get("p99")), 2.0, p))
    for p in points:
        if p.get("transactions_per_s") == 100 and p["broker"] == "semel always":
            v = p.get("transaction_ms", {}).get("p99")
            row = {"target": "100 txn/s: transaction commit p99 <= 15 ms (scheduled start to committed)",
                   "measured_ms": v, "limit_ms": 15, "met": v is not None and v <= 15,
                   "commit_call_p99_ms": p.get("commit_call_ms", {}).get("p99")}
            if not row["met"]:
                row["where_the_time_went"] = _stage_means(p, APIS[2:])
            rows.append(row)
    return rows


def _target(name: str, ratio, limit: float, point: dict) -> dict:
    row = {"target": name, "ratio": ratio, "limit": limit, "met": ratio is not None and ratio <= limit}
    if not row["met"]:
        row["where_the_time_went"] = _stage_means(point, ("produce",))
    return row


def _stage_means(point: dict, apis: tuple[str, ...]) -> dict:
    """{api: {stage: mean ms}} of a point's breakdown, plus the event loop's lag."""
    b = point.get("breakdown", {})
    out = {api: {k: v["mean_ms"] for k, v in b[api].items() if isinstance(v, dict)} for api in apis if api in b}
    if "event_loop_lag" in b:
        out["event_loop_lag"] = b["event_loop_lag"]
    return out

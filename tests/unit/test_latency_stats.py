"""bench.latency_stats: percentiles of raw latencies, a point's stage breakdown from two
scrapes of the broker's histograms, and the targets' ratios with met/missed (and the
stage means carried by a missed one)."""
from __future__ import annotations

import math

from bench.latency_stats import breakdown, summary_ms, targets


def test_summary_ms_takes_the_nearest_rank():
    s = summary_ms([i / 1000 for i in range(1, 1001)])   # 1 ms .. 1000 ms
    assert s == {"count": 1000, "p50": 500.0, "p99": 990.0, "p99_9": 999.0, "max": 1000.0}
    assert summary_ms([]) == {"count": 0}


def _histogram(name: str, labels: dict, counts: dict[float, float], total_s: float) -> dict:
    key = tuple(sorted(labels.items()))
    out = {(f"{name}_bucket", tuple(sorted({**labels, "le": str(le)}.items()))): v for le, v in counts.items()}
    out[(f"{name}_count", key)] = counts[math.inf]
    out[(f"{name}_sum", key)] = total_s
    return out


def test_breakdown_reads_the_difference_of_two_scrapes():
    before = _histogram("semel_request_seconds", {"api": "produce"}, {0.001: 10, 0.01: 10, math.inf: 10}, 0.005)
    # 100 more requests: 90 under 1 ms, 9 more under 10 ms, one slower
    after = _histogram("semel_request_seconds", {"api": "produce"}, {0.001: 100, 0.01: 109, math.inf: 110}, 0.205)
    for stage in ("request_queue", "local", "response_queue", "remote", "send"):
        after.update(_histogram("semel_request_stage_seconds", {"api": "produce", "stage": stage},
                                {0.001: 100, math.inf: 100}, 0.04))
    b = breakdown(before, after, ("produce", "fetch"))
    assert b["produce"]["requests"] == 100
    assert b["produce"]["total"] == {"mean_ms": 2.0, "p50_le_ms": 1.0, "p99_le_ms": 10.0}
    assert b["produce"]["remote"]["mean_ms"] == 0.4
    assert "fetch" not in b   # nothing answered: no row


def _point(broker, workload, p99, p99_9=None, **extra):
    return {"broker": broker, "workload": workload, "publish_ms": {"p99": p99, "p99_9": p99_9 or p99}, **extra}


def test_targets_give_ratios_and_say_where_a_missed_one_went():
    slow = {"produce": {"requests": 5, "total": {"mean_ms": 9.0}, "remote": {"mean_ms": 7.0}}}
    points = [_point("semel always", "1KiB@5000", 12.0, 20.0, breakdown=slow),
              _point("semel interval", "1KiB@5000", 4.0), _point("tansu", "1KiB@5000", 15.0, 9.0),
              {"broker": "semel always", "workload": "txn@100", "transactions_per_s": 100,
               "transaction_ms": {"p99": 9.5}, "commit_call_ms": {"p99": 4.0}}]
    rows = {r["target"]: r for r in targets(points)}
    vs_interval = rows["1KiB@5000: always p99 <= 1.5x interval p99"]
    assert (vs_interval["ratio"], vs_interval["met"]) == (3.0, False)
    assert vs_interval["where_the_time_went"]["produce"]["remote"] == 7.0
    vs_tansu = rows["1KiB@5000: always p99 <= Tansu p99"]
    assert (vs_tansu["ratio"], vs_tansu["met"]) == (0.8, True) and "where_the_time_went" not in vs_tansu
    assert rows["1KiB@5000: always p99.9 <= 2x Tansu p99.9"]["ratio"] == 2.22
    # a rate with no points is missed, not met
    assert rows["1KiB@10000: always p99 <= Tansu p99"]["met"] is False
    txn = rows["100 txn/s: transaction commit p99 <= 15 ms (scheduled start to committed)"]
    assert (txn["measured_ms"], txn["met"]) == (9.5, True)

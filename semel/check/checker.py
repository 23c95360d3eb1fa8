"""Run every analysis over a history and summarise: the checker's front door."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from . import analyses
from .facts import Facts, gather, isolation_of
from .history import History, load

MAX_CASES = 50  # cases kept per class in the summary (counts stay exact)


def analyze(history: History | str | Path, max_cases: int = MAX_CASES) -> dict:
    """Returns {"valid", "anomaly_counts", "anomalies", "stats"}; valid is True
    only when every analysis found nothing."""
    if not isinstance(history, History):
        history = load(history)
    facts = gather(history)
    found = analyses.run_all(facts)
    counts = {name: len(found[name]) for name in analyses.ANALYSES}
    return {
        "valid": not any(counts.values()),
        "anomaly_counts": counts,
        "anomalies": {name: cases[:max_cases] for name, cases in found.items() if cases},
        "stats": stats(facts),
        "_facts": facts,  # for the plot; private keys are dropped from the JSON summary
        "_all_anomalies": found,
    }


def stats(facts: Facts) -> dict:
    ops = facts.history.ops
    by_type = Counter(f"{op.f}:{op.type}" for op in ops)
    sends = [s for op in ops for s in op.sends]
    reads_rc = sum(len(op.reads) for op in ops if op.reads and isolation_of(op) == "read_committed")
    reads_ru = sum(len(op.reads) for op in ops if op.reads and isolation_of(op) == "read_uncommitted")
    nemesis = Counter(e.get("f") for e in facts.history.events
                      if e.get("process") == "nemesis" and e.get("type") == "invoke")
    # The controller's own notes: phases, and trouble such as workers that could not start.
    notes = Counter(e.get("f") for e in facts.history.events
                    if e.get("process") == "nemesis" and e.get("type") == "info" and e.get("f") not in nemesis)
    return {
        "ops": dict(sorted(by_type.items())),
        "values_sent": len(sends),
        "values_acknowledged": sum(len(op.sends) for op in ops if op.type == "ok"),
        "reads_read_committed": reads_rc,
        "reads_read_uncommitted": reads_ru,
        "keys": sorted(facts.log, key=str),
        "faults": dict(sorted(nemesis.items())),
        "controller_events": dict(sorted(notes.items())),
        "duration_s": round(max((op.time for op in ops), default=0) / 1e9, 3),
        "longest_commit_gap_s": longest_commit_gap(ops),
    }


def longest_commit_gap(ops: list) -> float:
    """Longest stretch without an acknowledged commit (availability, not safety)."""
    times = sorted(op.time for op in ops if op.f == "txn" and op.type == "ok")
    if len(times) < 2:
        return 0.0
    return round(max(b - a for a, b in zip(times, times[1:])) / 1e9, 3)

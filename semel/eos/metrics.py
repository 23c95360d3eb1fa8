"""Prometheus metrics of the exactly-once runtime.

Operators alert on `semel_eos_cycles_total{outcome="fatal"}`: it is the only
cycle outcome that needs a person. Everything is registered on the registry
given (a private one by default, so several runtimes or tests can coexist;
pass `prometheus_client.REGISTRY` to expose them on the default endpoint).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_CYCLE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class EosMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.cycles = Counter("semel_eos_cycles", "Commit cycles by outcome (succeeded, aborted, fatal) "
                              "and failing step", ["outcome", "step"], registry=r)
        self.cycle_seconds = Histogram("semel_eos_cycle_duration_seconds", "Wall time of a commit cycle",
                                       ["outcome"], buckets=_CYCLE_BUCKETS, registry=r)
        self.sink_prepare_seconds = Histogram("semel_eos_sink_prepare_seconds", "Latency of sink prepare",
                                              ["sink"], buckets=_LATENCY_BUCKETS, registry=r)
        self.sink_commit_seconds = Histogram("semel_eos_sink_commit_seconds", "Latency of sink commit",
                                             ["sink"], buckets=_LATENCY_BUCKETS, registry=r)
        self.sink_failures = Counter("semel_eos_sink_failures", "Non-OK sink answers",
                                     ["sink", "step", "kind"], registry=r)
        self.recovery = Counter("semel_eos_recovery_decisions", "Stranded transactions found at start, "
                                "by decision (commit, abort, undecided)", ["participant", "decision"],
                                registry=r)
        self.undecided = Gauge("semel_eos_recovery_undecided", "Stranded transactions left undecided at "
                               "the last start (need an operator)", ["participant"], registry=r)
        self.last_committed_cycle = Gauge("semel_eos_last_committed_cycle", "Cycle number of the last "
                                          "committed broker transaction", registry=r)

    # -- hooks used by the cycle, the guard and recovery
    def cycle_done(self, kind: str, step: str, seconds: float) -> None:
        self.cycles.labels(kind, step).inc()
        self.cycle_seconds.labels(kind).observe(seconds)

    def sink_latency(self, sink: str, op: str, seconds: float) -> None:
        hist = self.sink_prepare_seconds if op == "prepare" else self.sink_commit_seconds
        hist.labels(sink).observe(seconds)

    def sink_failure(self, sink: str, step: str, outcome) -> None:
        kind = type(outcome).__name__.lower()
        self.sink_failures.labels(sink, step, kind).inc()

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Current value of a sample (tests, benchmarks); 0.0 if never set."""
        v = self.registry.get_sample_value(name, labels or {})
        return 0.0 if v is None else v

"""HTTP echo sink: buffers in memory; on commit a callback receives the whole batch.

This is the shape of a sink whose endpoint takes one request per committed
batch. Prepared batches live in `MemorySinkState`, so they survive only as
long as that object does; the callback must accept a repeated txn id (commit
is retried after failures and at recovery), e.g. by using it as an
idempotency key downstream.
"""
from __future__ import annotations

from typing import Callable

from semel.eos.outcomes import OK, Retryable, SinkOutcome
from semel.eos.sinks.memory import MemorySink, MemorySinkState


class HttpEchoSink(MemorySink):
    def __init__(self, on_commit: Callable[[str, list], object], name: str = "http_echo",
                 state: MemorySinkState | None = None, timeout: float | None = 30.0):
        super().__init__(name, state, timeout)
        self.on_commit = on_commit

    def commit(self, txn_id: str) -> SinkOutcome:
        s = self.state
        if txn_id in s.committed:
            return OK
        if txn_id in s.prepared:
            # Deliver before marking committed: if delivery fails the batch
            # stays prepared and a retry delivers it again.
            try:
                self.on_commit(txn_id, list(s.prepared[txn_id]))
            except Exception as exc:  # noqa: BLE001
                return Retryable(f"on_commit callback raised {type(exc).__name__}: {exc}")
        return super().commit(txn_id)

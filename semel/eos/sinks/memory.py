"""In-memory two-phase-commit sink.

The external system's state (`MemorySinkState`) is separate from the sink
object, so tests can model a process restart: a new `MemorySink` on the same
state has lost its staged rows, as a crashed process would, but sees every
prepared and committed batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from semel.eos.outcomes import OK, Fatal, SinkOutcome
from semel.eos.sink import TwoPhaseSink


@dataclass
class MemorySinkState:
    prepared: dict[str, list] = field(default_factory=dict)
    committed: dict[str, list] = field(default_factory=dict)  # insertion order = commit order
    aborted: set[str] = field(default_factory=set)

    def committed_rows(self) -> list:
        return [r for rows in self.committed.values() for r in rows]


class MemorySink(TwoPhaseSink):
    def __init__(self, name: str = "memory", state: MemorySinkState | None = None, timeout: float | None = None):
        self.name = name
        self.state = state if state is not None else MemorySinkState()
        self.timeout = timeout
        self.staged: list = []

    def stage(self, row: Any) -> None:
        self.staged.append(row)

    def prepare(self, txn_id: str, rows: Sequence[Any] = ()) -> SinkOutcome:
        s = self.state
        if txn_id in s.prepared or txn_id in s.committed:
            if self.staged or rows:
                return Fatal(f"{txn_id} is already prepared; refusing to drop {len(self.staged) + len(rows)} "
                             "new rows")
            return OK
        s.prepared[txn_id] = self.staged + list(rows)
        s.aborted.discard(txn_id)
        self.staged = []
        return OK

    def commit(self, txn_id: str) -> SinkOutcome:
        s = self.state
        if txn_id in s.committed:
            return OK
        if txn_id not in s.prepared:
            return Fatal(f"{txn_id} is not prepared; nothing to commit")
        s.committed[txn_id] = s.prepared.pop(txn_id)
        return self._on_commit(txn_id, s.committed[txn_id])

    def _on_commit(self, txn_id: str, rows: list) -> SinkOutcome:
        return OK

    def abort(self, txn_id: str) -> SinkOutcome:
        self.staged = []
        s = self.state
        if txn_id in s.committed:
            return Fatal(f"{txn_id} is already committed; cannot abort")
        s.prepared.pop(txn_id, None)
        s.aborted.add(txn_id)
        return OK

    def recover(self) -> list[str]:
        return sorted(self.state.prepared)

"""A transactional key-value state store for the commit cycle.

Writes made during a cycle go to a per-cycle buffer; reads see the buffer
first, then the backing store. The store takes part in the cycle like a
two-phase-commit participant:

    preCommit2PC  prepare(txn_id)  the buffer is written to the backing
                                   store as pending under the txn id
    storeCommit   commit(txn_id)   pending writes are drained into the
                                   live table (idempotent)
    abort path    abort(txn_id)    buffer and pending writes are dropped
    start         recover()        txn ids with pending writes

so a crash between the broker commit and storeCommit is finished at the next
start exactly like a stranded sink transaction.

Backings: `MemoryBacking` (a dict; nothing survives the process) and
`SqliteBacking` (a file; pending and live tables change in one SQLite
transaction, so every drain is all-or-nothing).

`IdempotencyTokens` is the pattern for side effects that have no 2PC sink:
record a token per input in the store, skip the effect if the token is there.
"""
from __future__ import annotations

import abc
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from semel.eos.outcomes import OK, SinkOutcome

_TOMBSTONE = object()


class Backing(abc.ABC):
    @abc.abstractmethod
    def get(self, key: str) -> Any: ...           # raises KeyError when absent

    @abc.abstractmethod
    def stage(self, txn_id: str, writes: dict[str, Any]) -> None: ...  # value _TOMBSTONE = delete

    @abc.abstractmethod
    def apply(self, txn_id: str) -> None: ...     # drain pending writes of txn_id; no-op if none

    @abc.abstractmethod
    def discard(self, txn_id: str) -> None: ...   # drop pending writes of txn_id; no-op if none

    @abc.abstractmethod
    def pending(self) -> list[str]: ...

    @abc.abstractmethod
    def items(self) -> Iterator[tuple[str, Any]]: ...

    def close(self) -> None:
        pass


class MemoryBacking(Backing):
    def __init__(self) -> None:
        self.live: dict[str, Any] = {}
        self.staged: dict[str, dict[str, Any]] = {}

    def get(self, key: str) -> Any:
        return self.live[key]

    def stage(self, txn_id: str, writes: dict[str, Any]) -> None:
        self.staged[txn_id] = dict(writes)

    def apply(self, txn_id: str) -> None:
        for k, v in self.staged.pop(txn_id, {}).items():
            if v is _TOMBSTONE:
                self.live.pop(k, None)
            else:
                self.live[k] = v

    def discard(self, txn_id: str) -> None:
        self.staged.pop(txn_id, None)

    def pending(self) -> list[str]:
        return sorted(self.staged)

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(sorted(self.live.items()))


class SqliteBacking(Backing):
    """Durable backing on one SQLite file. Values are stored as JSON."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        # The guard may call from a worker thread; serialise use of the connection.
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS pending (txn TEXT NOT NULL, k TEXT NOT NULL, "
                         "v TEXT, PRIMARY KEY (txn, k))")
        self._db.execute("CREATE TABLE IF NOT EXISTS pending_txn (txn TEXT PRIMARY KEY)")

    def get(self, key: str) -> Any:
        with self._lock:
            row = self._db.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
        if row is None:
            raise KeyError(key)
        return json.loads(row[0])

    def stage(self, txn_id: str, writes: dict[str, Any]) -> None:
        rows = [(txn_id, k, None if v is _TOMBSTONE else json.dumps(v)) for k, v in writes.items()]
        with self._lock, self._txn():
            self._db.execute("DELETE FROM pending WHERE txn = ?", (txn_id,))
            self._db.executemany("INSERT INTO pending (txn, k, v) VALUES (?, ?, ?)", rows)
            self._db.execute("INSERT OR IGNORE INTO pending_txn (txn) VALUES (?)", (txn_id,))

    def apply(self, txn_id: str) -> None:
        with self._lock, self._txn():
            self._db.execute("INSERT OR REPLACE INTO kv (k, v) SELECT k, v FROM pending "
                             "WHERE txn = ? AND v IS NOT NULL", (txn_id,))
            self._db.execute("DELETE FROM kv WHERE k IN (SELECT k FROM pending WHERE txn = ? AND v IS NULL)",
                             (txn_id,))
            self._drop(txn_id)

    def discard(self, txn_id: str) -> None:
        with self._lock, self._txn():
            self._drop(txn_id)

    def pending(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT txn FROM pending_txn ORDER BY txn")]

    def items(self) -> Iterator[tuple[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT k, v FROM kv ORDER BY k").fetchall()
        return iter([(k, json.loads(v)) for k, v in rows])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _drop(self, txn_id: str) -> None:
        self._db.execute("DELETE FROM pending WHERE txn = ?", (txn_id,))
        self._db.execute("DELETE FROM pending_txn WHERE txn = ?", (txn_id,))

    def _txn(self):
        db = self._db

        class _Tx:
            def __enter__(self):
                db.execute("BEGIN IMMEDIATE")

            def __exit__(self, exc_type, *_):
                db.execute("ROLLBACK" if exc_type else "COMMIT")
                return False
        return _Tx()


class TransactionalStore:
    """Key-value store whose writes become durable only with a committed cycle.

    Keys are strings; with `SqliteBacking`, values must be JSON-serialisable.
    """

    name = "store"
    timeout: float | None = 30.0

    def __init__(self, backing: Backing | None = None):
        self.backing = backing if backing is not None else MemoryBacking()
        self._buffer: dict[str, Any] = {}

    # -- reads and writes of the open cycle
    def get(self, key: str, default: Any = None) -> Any:
        if key in self._buffer:
            v = self._buffer[key]
            return default if v is _TOMBSTONE else v
        try:
            return self.backing.get(key)
        except KeyError:
            return default

    def __contains__(self, key: str) -> bool:
        return self.get(key, _TOMBSTONE) is not _TOMBSTONE

    def put(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"store keys are strings, got {type(key).__name__}")
        if isinstance(self.backing, SqliteBacking):
            json.dumps(value)  # fail now, in the cycle, not later in storeCommit
        self._buffer[key] = value

    def delete(self, key: str) -> None:
        self._buffer[key] = _TOMBSTONE

    def items(self) -> dict[str, Any]:
        """Committed contents (buffer not included)."""
        return dict(self.backing.items())

    # -- participant operations (called through SinkGuard by the cycle)
    def prepare(self, txn_id: str, rows: Any = ()) -> SinkOutcome:
        if self._buffer:
            self.backing.stage(txn_id, self._buffer)
        self._buffer = {}
        return OK

    def commit(self, txn_id: str) -> SinkOutcome:
        self.backing.apply(txn_id)
        return OK

    def abort(self, txn_id: str) -> SinkOutcome:
        self._buffer = {}
        self.backing.discard(txn_id)
        return OK

    def recover(self) -> list[str]:
        return self.backing.pending()

    def close(self) -> None:
        self.backing.close()


class IdempotencyTokens:
    """Run a side effect at most once per token among committed cycles.

    The token write rides in the store's cycle buffer, so it commits with the
    consumed offsets. If the cycle aborts, the token is dropped with it and the
    effect may run again when the input is replayed: make the effect itself
    accept a repeated token (e.g. pass it as an idempotency key downstream).
    """

    def __init__(self, store: TransactionalStore, prefix: str = "__token__/"):
        self.store = store
        self.prefix = prefix

    def seen(self, token: str) -> bool:
        return (self.prefix + token) in self.store

    def once(self, token: str, effect: Callable[[], Any]) -> bool:
        """Run effect unless token is recorded; return True if it ran."""
        if self.seen(token):
            return False
        effect()
        self.store.put(self.prefix + token, True)
        return True

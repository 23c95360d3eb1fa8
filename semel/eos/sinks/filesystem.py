"""Filesystem two-phase-commit sink.

    prepare  rows -> <root>/prepared/<txn>.batch   (temp file, fsync, rename, fsync dir)
    commit   rename prepared/<txn>.batch -> committed/<txn>.batch, fsync both dirs
    abort    unlink prepared/<txn>.batch, fsync dir
    recover  names in prepared/

A rename within one filesystem is atomic, so after any crash a batch is in
exactly one of the two directories. A batch file is JSON Lines, one row per
line; rows must be JSON-serialisable (checked at stage time).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from semel.eos.outcomes import OK, Fatal, SinkOutcome
from semel.eos.sink import TwoPhaseSink
from semel.eos.sinks.fsync import fsync_dir
from semel.eos.sinks.rows import encode_json_row

SUFFIX = ".batch"


class FileSystemSink(TwoPhaseSink):
    def __init__(self, root: str | Path, name: str = "filesystem", timeout: float | None = 30.0):
        self.name = name
        self.timeout = timeout
        self.root = Path(root)
        self.prepared_dir = self.root / "prepared"
        self.committed_dir = self.root / "committed"
        for d in (self.root, self.prepared_dir, self.committed_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.staged: list[str] = []

    def _paths(self, txn_id: str) -> tuple[Path, Path]:
        if not txn_id or "/" in txn_id or txn_id.startswith("."):
            raise ValueError(f"txn id not usable as a file name: {txn_id!r}")
        return self.prepared_dir / (txn_id + SUFFIX), self.committed_dir / (txn_id + SUFFIX)

    def stage(self, row: Any) -> None:
        self.staged.append(encode_json_row(row, "filesystem"))

    def prepare(self, txn_id: str, rows: Sequence[Any] = ()) -> SinkOutcome:
        prepared, committed = self._paths(txn_id)
        lines = self.staged + [encode_json_row(r, "filesystem") for r in rows]
        if prepared.exists() or committed.exists():
            if lines:
                return Fatal(f"{txn_id} is already prepared; refusing to drop {len(lines)} new rows")
            return OK
        tmp = self.prepared_dir / f".{txn_id}{SUFFIX}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, prepared)
        fsync_dir(self.prepared_dir)
        self.staged = []
        return OK

    def commit(self, txn_id: str) -> SinkOutcome:
        prepared, committed = self._paths(txn_id)
        if committed.exists():
            return OK
        if not prepared.exists():
            return Fatal(f"{txn_id} is not prepared; nothing to commit")
        os.rename(prepared, committed)
        fsync_dir(self.committed_dir)
        fsync_dir(self.prepared_dir)
        return OK

    def abort(self, txn_id: str) -> SinkOutcome:
        self.staged = []
        prepared, committed = self._paths(txn_id)
        if committed.exists():
            return Fatal(f"{txn_id} is already committed; cannot abort")
        try:
            prepared.unlink()
        except FileNotFoundError:
            return OK
        fsync_dir(self.prepared_dir)
        return OK

    def recover(self) -> list[str]:
        out = []
        for entry in os.listdir(self.prepared_dir):
            if entry.startswith(".") and entry.endswith(".tmp"):
                os.unlink(self.prepared_dir / entry)  # a prepare torn by a crash; never visible
            elif entry.endswith(SUFFIX):
                out.append(entry[: -len(SUFFIX)])
        return sorted(out)

    # -- readers
    def committed_batches(self) -> dict[str, list]:
        """Committed rows by txn id (what a downstream reader sees)."""
        out = {}
        for entry in sorted(os.listdir(self.committed_dir)):
            if entry.endswith(SUFFIX):
                with open(self.committed_dir / entry, encoding="utf-8") as f:
                    out[entry[: -len(SUFFIX)]] = [json.loads(line) for line in f if line.strip()]
        return out

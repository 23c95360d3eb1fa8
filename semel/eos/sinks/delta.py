"""Delta Lake two-phase-commit sink (deltalake).

    prepare  write the batch to <table>/_semel_pending/<txn>.parquet (Delta
             readers and VACUUM ignore directories starting with '_')
    commit   append it to the table in one Delta commit that records the
             application transaction (app id "<app>-<instance>", version = cycle)
             and semel.txn=<txn> in the commit info; then delete the staged file
    abort    delete the staged file
    recover  staged files whose txn is not committed (a staged file of a
             committed txn is a clean-up a crash interrupted; finished here)

Idempotence comes from Delta's application transaction ids: if the table
records version == cycle for our app id, that cycle committed and a repeated
commit is a no-op. Cycles commit in order, so a recorded version above the
cycle sends the check to the commit history (rare).

`txn_column`, if set, is filled with the txn id in every row (lineage, and
lets readers group rows by batch).
"""
from __future__ import annotations

import io
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from semel.eos.outcomes import OK, Fatal, SinkOutcome
from semel.eos.sink import TwoPhaseSink
from semel.eos.sinks.rows import check_columns
from semel.eos.txnid import SinkTxnId

PENDING_DIR = "_semel_pending"
TXN_KEY = "semel.txn"


class DeltaSink(TwoPhaseSink):
    def __init__(self, table_uri: str, schema: pa.Schema, *, name: str = "delta", txn_column: str | None = None,
                 storage_options: dict[str, str] | None = None, filesystem: pafs.FileSystem | None = None,
                 timeout: float | None = 60.0):
        if txn_column is not None and txn_column not in schema.names:
            raise ValueError(f"txn_column {txn_column!r} is not in the schema {schema.names}")
        self.uri = table_uri.rstrip("/")
        self.schema = schema
        self.name, self.timeout = name, timeout
        self.txn_column = txn_column
        self.storage_options = storage_options
        if filesystem is None:
            filesystem, root = pafs.FileSystem.from_uri(self.uri if "://" in self.uri else f"file://{self.uri}")
        else:
            root = self.uri.split("://", 1)[-1]
        self.fs, self.root = filesystem, root
        if not DeltaTable.is_deltatable(self.uri, storage_options=storage_options):
            DeltaTable.create(self.uri, schema, storage_options=storage_options)
        self.fs.create_dir(f"{root}/{PENDING_DIR}", recursive=True)
        self.staged: list[dict] = []

    # ------------------------------------------------------------ helpers
    def _staged_path(self, txn_id: str) -> str:
        SinkTxnId.parse(txn_id)  # the cycle number is the Delta app-transaction version
        return f"{self.root}/{PENDING_DIR}/{txn_id}.parquet"

    def _app_and_version(self, txn_id: str) -> tuple[str, int]:
        tid = SinkTxnId.parse(txn_id)
        return f"{tid.app_id}-{tid.instance_id}", tid.cycle

    def _committed(self, txn_id: str) -> bool:
        app, version = self._app_and_version(txn_id)
        dt = DeltaTable(self.uri, storage_options=self.storage_options)
        recorded = dt.transaction_version(app)
        if recorded is None or recorded < version:
            return False
        if recorded == version:
            return True
        return any(h.get(TXN_KEY) == txn_id for h in dt.history())

    def _exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def _check(self, row: Any) -> dict:
        return check_columns(row, self.schema.names, "delta", "schema")

    # ------------------------------------------------------------ contract
    def stage(self, row: Any) -> None:
        self.staged.append(self._check(row))

    def prepare(self, txn_id: str, rows: Sequence[Any] = ()) -> SinkOutcome:
        path = self._staged_path(txn_id)
        batch = self.staged + [self._check(r) for r in rows]
        if self._exists(path) or self._committed(txn_id):
            if batch:
                return Fatal(f"{txn_id} is already prepared; refusing to drop {len(batch)} new rows")
            return OK
        if self.txn_column is not None:
            batch = [dict(r, **{self.txn_column: txn_id}) for r in batch]
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(batch, schema=self.schema), buf)
        tmp = f"{path}.tmp"
        with self.fs.open_output_stream(tmp) as f:
            f.write(buf.getvalue())
        self.fs.move(tmp, path)  # a torn write never carries the final name
        self.staged = []
        return OK

    def commit(self, txn_id: str) -> SinkOutcome:
        path = self._staged_path(txn_id)
        if not self._committed(txn_id):
            if not self._exists(path):
                return Fatal(f"{txn_id} is not prepared; nothing to commit")
            with self.fs.open_input_file(path) as f:
                data = pq.read_table(f, schema=self.schema)
            app, version = self._app_and_version(txn_id)
            write_deltalake(self.uri, data, mode="append", storage_options=self.storage_options,
                            commit_properties=CommitProperties(app_transactions=[Transaction(app, version)],
                                                               custom_metadata={TXN_KEY: txn_id}))
        if self._exists(path):
            self.fs.delete_file(path)
        return OK

    def abort(self, txn_id: str) -> SinkOutcome:
        self.staged = []
        path = self._staged_path(txn_id)
        if self._committed(txn_id):
            return Fatal(f"{txn_id} is already committed; cannot abort")
        if self._exists(path):
            self.fs.delete_file(path)
        return OK

    def recover(self) -> list[str]:
        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/{PENDING_DIR}", allow_not_found=True))
        out = []
        for info in infos:
            name = info.base_name
            if name.endswith(".tmp"):
                self.fs.delete_file(info.path)  # a prepare torn by a crash
                continue
            if not name.endswith(".parquet"):
                continue
            txn_id = name[: -len(".parquet")]
            if self._committed(txn_id):
                self.fs.delete_file(info.path)  # committed; the clean-up was cut short
            else:
                out.append(txn_id)
        return sorted(out)

    # ------------------------------------------------------------ readers
    def committed_batches(self) -> dict[str, list]:
        """Rows per txn id (needs txn_column) plus empty committed batches from the history."""
        if self.txn_column is None:
            raise ValueError("committed_batches needs a txn_column")
        dt = DeltaTable(self.uri, storage_options=self.storage_options)
        out: dict[str, list] = {h[TXN_KEY]: [] for h in dt.history() if TXN_KEY in h}
        for row in dt.to_pyarrow_table().to_pylist():
            txn = row.pop(self.txn_column)
            out.setdefault(txn, []).append(row)
        return out

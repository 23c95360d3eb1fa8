"""Apache Iceberg two-phase-commit sink (pyiceberg).

    prepare  write the batch as Parquet data files under <table>/data/, then a
             pending marker <table>/_semel_pending/<txn>.json listing them
             (the table's metadata does not reference them yet: invisible)
    commit   add the files in one snapshot whose summary carries
             semel.txn=<txn>, then delete the marker. A txn whose id is already
             in a snapshot summary is committed: a repeated commit is a no-op.
    abort    delete the marker's data files (orphans) and the marker
    recover  markers under _semel_pending/ whose txn is in no snapshot (a
             marker of a committed txn is a clean-up a crash interrupted; it
             is finished here)

An empty batch commits as an empty append, so it too leaves its txn id in a
snapshot. Orphan-file clean-up jobs must use an age threshold longer than the
commit interval, or they will delete prepared files.
"""
from __future__ import annotations

import io
import json
import uuid
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from semel.eos.outcomes import OK, Fatal, SinkOutcome
from semel.eos.sink import TwoPhaseSink
from semel.eos.sinks.rows import check_columns

TXN_PROPERTY = "semel.txn"
PENDING_DIR = "_semel_pending"


class IcebergSink(TwoPhaseSink):
    def __init__(self, catalog: Any, identifier: str, *, name: str = "iceberg", timeout: float | None = 60.0,
                 filesystem: pafs.FileSystem | None = None):
        self.catalog = catalog
        self.identifier = identifier
        self.name, self.timeout = name, timeout
        table = catalog.load_table(identifier)
        self._schema = _plain(table.schema().as_arrow())
        location = table.location().rstrip("/")
        if filesystem is None:
            filesystem, root = pafs.FileSystem.from_uri(location)
        else:
            root = location.split("://", 1)[-1]
        self.fs, self.root = filesystem, root
        self._scheme = location.split("://", 1)[0] + "://" if "://" in location else ""
        self.fs.create_dir(f"{root}/{PENDING_DIR}", recursive=True)
        self.fs.create_dir(f"{root}/data", recursive=True)
        self.staged: list[dict] = []

    # ------------------------------------------------------------ helpers
    def _table(self):
        return self.catalog.load_table(self.identifier)

    def _committed_txns(self, table) -> set[str]:
        return {s.summary.additional_properties.get(TXN_PROPERTY) for s in table.metadata.snapshots
                if s.summary is not None} - {None}

    def _marker(self, txn_id: str) -> str:
        if not txn_id or "/" in txn_id:
            raise ValueError(f"txn id not usable in a path: {txn_id!r}")
        return f"{self.root}/{PENDING_DIR}/{txn_id}.json"

    def _read_marker(self, txn_id: str) -> dict | None:
        try:
            with self.fs.open_input_stream(self._marker(txn_id)) as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None

    def _exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def _write_atomic(self, path: str, data: bytes) -> None:
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        self.fs.move(tmp, path)

    def _check(self, row: Any) -> dict:
        return check_columns(row, self._schema.names, "iceberg", "table")

    # ------------------------------------------------------------ contract
    def stage(self, row: Any) -> None:
        self.staged.append(self._check(row))

    def prepare(self, txn_id: str, rows: Sequence[Any] = ()) -> SinkOutcome:
        batch = self.staged + [self._check(r) for r in rows]
        if self._exists(self._marker(txn_id)) or txn_id in self._committed_txns(self._table()):
            if batch:
                return Fatal(f"{txn_id} is already prepared; refusing to drop {len(batch)} new rows")
            return OK
        files = []
        if batch:
            data = pa.Table.from_pylist(batch, schema=self._schema)
            path = f"{self.root}/data/semel-{txn_id}-{uuid.uuid4().hex}.parquet"
            buf = io.BytesIO()
            pq.write_table(data, buf)
            self._write_atomic(path, buf.getvalue())
            files.append(self._scheme + path)
        # The marker is written last: a crash before it leaves only orphan data
        # files that no snapshot references and nothing lists as prepared.
        self._write_atomic(self._marker(txn_id), json.dumps({"txn": txn_id, "files": files}).encode())
        self.staged = []
        return OK

    def commit(self, txn_id: str) -> SinkOutcome:
        table = self._table()
        marker = self._read_marker(txn_id)
        if txn_id not in self._committed_txns(table):
            if marker is None:
                return Fatal(f"{txn_id} is not prepared; nothing to commit")
            props = {TXN_PROPERTY: txn_id}
            if marker["files"]:
                table.add_files(marker["files"], snapshot_properties=props)
            else:
                table.append(pa.Table.from_pylist([], schema=self._schema), snapshot_properties=props)
        if marker is not None:
            self.fs.delete_file(self._marker(txn_id))
        return OK

    def abort(self, txn_id: str) -> SinkOutcome:
        self.staged = []
        marker = self._read_marker(txn_id)
        if txn_id in self._committed_txns(self._table()):
            return Fatal(f"{txn_id} is already committed; cannot abort")
        if marker is None:
            return OK
        for uri in marker["files"]:
            path = uri[len(self._scheme):] if uri.startswith(self._scheme) else uri
            if self._exists(path):
                self.fs.delete_file(path)
        self.fs.delete_file(self._marker(txn_id))
        return OK

    def recover(self) -> list[str]:
        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/{PENDING_DIR}", allow_not_found=True))
        txns = [i.base_name[:-len(".json")] for i in infos
                if i.type == pafs.FileType.File and i.base_name.endswith(".json")]
        if not txns:
            return []
        committed = self._committed_txns(self._table())
        out = []
        for txn_id in txns:
            if txn_id in committed:
                self.fs.delete_file(self._marker(txn_id))  # committed; the marker clean-up was cut short
            else:
                out.append(txn_id)
        return sorted(out)

    # ------------------------------------------------------------ readers
    def committed_batches(self) -> dict[str, list]:
        """Rows per txn id, read back from the table (tests, small tables)."""
        table = self._table()
        out: dict[str, list] = {t: [] for t in self._committed_txns(table)}
        by_file = {}
        for s in table.metadata.snapshots:
            txn = s.summary.additional_properties.get(TXN_PROPERTY) if s.summary else None
            if txn is None:
                continue
            for entry in s.manifests(table.io):
                for e in entry.fetch_manifest_entry(table.io, discard_deleted=True):
                    if e.snapshot_id == s.snapshot_id:
                        by_file[e.data_file.file_path] = txn
        for path, txn in by_file.items():
            p = path[len(self._scheme):] if path.startswith(self._scheme) else path
            with self.fs.open_input_file(p) as f:
                out[txn].extend(pq.read_table(f).to_pylist())
        return out


def _plain(schema: pa.Schema) -> pa.Schema:
    """The table's Arrow schema without Iceberg field-id metadata (add_files wants plain Parquet)."""
    return pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema])

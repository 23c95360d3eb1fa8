"""Delta Lake sink on a local table, idempotent through Delta application transaction ids."""
from __future__ import annotations

import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from tests.support.eos_cycles import cycle_into

from semel.eos import OK, Fatal
from semel.eos.sinks.delta import PENDING_DIR, DeltaSink
from semel.eos.testing import check_sink_contract

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string()), ("txn", pa.string())])
ROWS = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 3, "v": "c"}, {"k": 4, "v": "d"}]


def ks(uri):
    return sorted(r["k"] for r in DeltaTable(uri).to_pyarrow_table().to_pylist())


def test_delta_sink_meets_the_contract(tmp_path):
    uri = str(tmp_path / "t")
    check_sink_contract(lambda: DeltaSink(uri, SCHEMA, txn_column="txn"),
                        lambda: DeltaSink(uri, SCHEMA, txn_column="txn").committed_batches(), ROWS)


def test_commit_records_the_app_transaction_and_repeats_are_no_ops(tmp_path):
    uri = str(tmp_path / "t")
    s = DeltaSink(uri, SCHEMA)
    s.stage(ROWS[0])
    assert s.prepare("app-0-7") is OK
    assert ks(uri) == []
    assert s.commit("app-0-7") is OK
    dt = DeltaTable(uri)
    assert dt.transaction_version("app-0") == 7 and dt.version() == 1
    assert s.commit("app-0-7") is OK
    assert DeltaTable(uri).version() == 1 and ks(uri) == [1]
    assert isinstance(s.abort("app-0-7"), Fatal)


def test_crash_between_delta_commit_and_staged_delete_is_finished_by_recover(tmp_path):
    uri = str(tmp_path / "t")
    s = DeltaSink(uri, SCHEMA)
    s.prepare("app-0-3", ROWS[:2])
    staged = os.path.join(s.root, PENDING_DIR, "app-0-3.parquet")
    keep = open(staged, "rb").read()
    s.commit("app-0-3")
    open(staged, "wb").write(keep)             # as if the process died before deleting it
    assert s.recover() == [] and not os.path.exists(staged)
    assert ks(uri) == [1, 2]


def test_bad_input_is_rejected(tmp_path):
    uri = str(tmp_path / "t")
    with pytest.raises(ValueError, match="txn_column"):
        DeltaSink(uri, SCHEMA, txn_column="nope")
    s = DeltaSink(uri, SCHEMA)
    with pytest.raises(ValueError, match="not in the schema"):
        s.stage({"zzz": 1})
    with pytest.raises(ValueError, match="not a sink txn id"):
        s.prepare("not-a/txn", [])


def test_runtime_cycles_into_delta(tmp_path):
    uri = str(tmp_path / "t")
    cycle_into(DeltaSink(uri, SCHEMA, name="delta"), 7, lambda v: {"k": v, "v": str(v)},
               per_cycle=3, fail="commit_txn")
    assert ks(uri) == list(range(7))

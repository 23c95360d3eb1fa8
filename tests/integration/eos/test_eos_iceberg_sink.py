"""Iceberg sink with pyiceberg's SqlCatalog on SQLite and a local warehouse."""
from __future__ import annotations

import os

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from tests.support.eos_cycles import cycle_into

from semel.eos import OK, Fatal
from semel.eos.sinks.iceberg import PENDING_DIR, IcebergSink
from semel.eos.testing import check_sink_contract

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
ROWS = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 3, "v": "c"}, {"k": 4, "v": "d"}]


@pytest.fixture
def catalog(tmp_path):
    cat = SqlCatalog("test", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    cat.create_namespace("ns")
    cat.create_table("ns.t", schema=SCHEMA)
    return cat


def scan(cat):
    return sorted(r["k"] for r in cat.load_table("ns.t").scan().to_arrow().to_pylist())


def test_iceberg_sink_meets_the_contract(catalog):
    check_sink_contract(lambda: IcebergSink(catalog, "ns.t"), lambda: IcebergSink(catalog, "ns.t").committed_batches(),
                        ROWS)


def test_prepared_files_are_invisible_and_a_repeated_commit_adds_no_snapshot(catalog):
    s = IcebergSink(catalog, "ns.t")
    s.stage(ROWS[0])
    assert s.prepare("app-0-1") is OK
    assert scan(catalog) == [] and catalog.load_table("ns.t").metadata.snapshots == []
    assert s.commit("app-0-1") is OK
    snaps = catalog.load_table("ns.t").metadata.snapshots
    assert len(snaps) == 1 and snaps[0].summary.additional_properties["semel.txn"] == "app-0-1"
    assert s.commit("app-0-1") is OK
    assert len(catalog.load_table("ns.t").metadata.snapshots) == 1
    assert scan(catalog) == [1]


def test_abort_deletes_the_orphan_data_files(catalog):
    s = IcebergSink(catalog, "ns.t")
    s.prepare("app-0-2", ROWS[:2])
    data_dir = os.path.join(s.root, "data")
    assert len(os.listdir(data_dir)) == 1
    assert s.abort("app-0-2") is OK
    assert os.listdir(data_dir) == [] and os.listdir(os.path.join(s.root, PENDING_DIR)) == []
    assert s.recover() == [] and scan(catalog) == []


def test_crash_after_the_snapshot_before_the_marker_delete_is_finished_by_recover(catalog):
    s = IcebergSink(catalog, "ns.t")
    s.prepare("app-0-3", ROWS[:1])
    marker = s._read_marker("app-0-3")
    catalog.load_table("ns.t").add_files(marker["files"], snapshot_properties={"semel.txn": "app-0-3"})
    assert s.recover() == []                       # committed: only the marker clean-up was missing
    assert s.commit("app-0-3") is OK and isinstance(s.abort("app-0-3"), Fatal)
    assert scan(catalog) == [1]


def test_bad_rows_are_rejected_at_stage_time(catalog):
    s = IcebergSink(catalog, "ns.t")
    with pytest.raises(ValueError, match="not in the table"):
        s.stage({"k": 1, "nope": 2})
    with pytest.raises(TypeError):
        s.stage([1, "a"])


def test_runtime_cycles_into_iceberg(catalog):
    cycle_into(IcebergSink(catalog, "ns.t", name="ice"), 7, lambda v: {"k": v, "v": str(v)},
               per_cycle=3, fail="commit_offsets")
    assert scan(catalog) == list(range(7))

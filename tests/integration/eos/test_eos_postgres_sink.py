"""PostgreSQL sink on a real server: both modes, the contract, invisibility, recovery from pg_prepared_xacts."""
from __future__ import annotations

import uuid

import psycopg
import pytest

from tests.support.eos_cycles import cycle_into

from semel.eos import OK, EosRuntime, Fatal, Ledger, RecordingBroker, RecordingTxnBackend, SinkGuard
from semel.eos.sinks.postgres import PostgresSink
from semel.eos.testing import check_sink_contract

ROWS = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 3, "v": "c"}, {"k": 4, "v": "d"}]


@pytest.fixture
def table(pg_uri):
    name = f"t_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_uri, autocommit=True) as c:
        c.execute(f"CREATE TABLE {name} (k int, v text, txn_id text, pending boolean)")
    return name


@pytest.mark.parametrize("mode", ["prepared", "table"])
def test_postgres_sink_meets_the_contract(pg_uri, table, mode):
    key = f"{mode}:{table}"

    def committed():
        # What a reader sees: committed rows, grouped by the txn id column.
        where = "WHERE NOT pending" if mode == "table" else ""
        with psycopg.connect(pg_uri) as c:
            got = c.execute(f"SELECT txn_id, k, v FROM {table} {where}").fetchall()
            marks = [r[0] for r in c.execute("SELECT txn_id FROM semel_2pc_txns WHERE sink = %s AND "
                                             "state = 'committed'", (key,)).fetchall()]
        by_txn: dict[str, list] = {t: [] for t in marks}
        for t, k, v in got:
            by_txn.setdefault(t, []).append({"k": k, "v": v})
        return by_txn
    check_sink_contract(lambda: PostgresSink(pg_uri, table, ["k", "v"], mode=mode, name=mode,
                                             txn_column="txn_id"), committed, ROWS)


def test_prepared_rows_are_invisible_and_listed_in_pg_prepared_xacts(pg_uri, table):
    sink = PostgresSink(pg_uri, table, ["k", "v"], name="vis")
    sink.stage({"k": 1, "v": "x"})
    assert sink.prepare("app-0-1") is OK
    with psycopg.connect(pg_uri) as c:
        assert c.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0
        gids = [r[0] for r in c.execute("SELECT gid FROM pg_prepared_xacts").fetchall()]
    assert f"semel:vis:{table}:app-0-1" in gids
    assert sink.recover() == ["app-0-1"]
    assert sink.commit("app-0-1") is OK
    with psycopg.connect(pg_uri) as c:
        assert c.execute(f"SELECT k, v FROM {table}").fetchall() == [(1, "x")]
    sink.close()


def test_recovery_resolves_stranded_prepared_transactions_after_a_restart(pg_uri, table):
    a = PostgresSink(pg_uri, table, ["k", "v"], name="rec")
    a.prepare("app-0-4", [{"k": 4, "v": "committed-cycle"}])
    a.prepare("app-0-5", [{"k": 5, "v": "aborted-cycle"}])
    a.close()  # the process dies; PostgreSQL keeps both prepared
    broker = RecordingBroker()
    broker.position, broker.ledger = 0, Ledger(4)  # the broker says: cycle 4 committed, 5 did not
    rt = EosRuntime("app", "0", RecordingTxnBackend(broker, "app-0"),
                    [PostgresSink(pg_uri, table, ["k", "v"], name="rec")], commit_interval=0.1)
    report = rt.start()
    assert sorted((a.txn_id, str(a.decision)) for a in report.actions) == [("app-0-4", "commit"),
                                                                           ("app-0-5", "abort")]
    with psycopg.connect(pg_uri) as c:
        assert c.execute(f"SELECT k FROM {table}").fetchall() == [(4,)]
    assert rt.sinks[0].sink.recover() == []
    rt.close()


def test_bad_rows_and_configuration_are_clear_errors(pg_uri, table):
    with pytest.raises(ValueError, match="mode"):
        PostgresSink(pg_uri, table, ["k"], mode="xa")
    with pytest.raises(ValueError, match="bad table name"):
        PostgresSink(pg_uri, "a.b.c", ["k"])
    sink = PostgresSink(pg_uri, table, ["k", "v"])
    with pytest.raises(ValueError, match="do not match"):
        sink.stage({"k": 1})
    with pytest.raises(ValueError, match="sequence of 2"):
        sink.stage([1])
    assert sink.staged == []


def test_a_database_error_is_retryable_and_leaves_nothing_prepared(pg_uri, table):
    sink = PostgresSink(pg_uri, table, ["k", "v"], name="err")
    sink.stage({"k": "not-an-int", "v": "x"})
    out = SinkGuard(sink).prepare("app-0-7", [])
    assert not isinstance(out, type(OK)) and "InvalidTextRepresentation" in out.reason
    assert sink.recover() == []
    assert sink.abort("app-0-7") is OK
    assert isinstance(sink.commit("app-0-7"), Fatal)


def test_runtime_cycles_into_postgres_table_mode(pg_uri, table):
    cycle_into(PostgresSink(pg_uri, table, ["k", "v"], mode="table", name="pg"), 9,
               lambda v: {"k": v, "v": str(v)}, per_cycle=4, fail="commit_txn")
    with psycopg.connect(pg_uri) as c:
        got = sorted(r[0] for r in c.execute(f"SELECT k FROM {table} WHERE NOT pending").fetchall())
        assert c.execute(f"SELECT count(*) FROM {table} WHERE pending").fetchone()[0] == 0
    assert got == list(range(9))

"""The console's pure parts: which open transactions hang (KIP-664) and which LSO each
holds back, throughput between two views, a `semel check` history as a timeline, and
the plans its write actions confirm."""
from __future__ import annotations

import json

import pytest

from semel.client.admin import GroupMember, ProducerInfo, TxnDescription
from semel.console import actions
from semel.console.extras import timeline
from semel.console.poller import appended
from semel.console.snapshot import GroupRow, LagRow, PartitionRow, Snapshot, open_transactions
from semel.protocol.errors import KafkaError

NOW = 1_000_000


def _snap(*parts: PartitionRow) -> Snapshot:
    return Snapshot(time_ms=NOW, partitions=list(parts))


def _part(topic: str, p: int, hw: int, lso: int, start: int = 0) -> PartitionRow:
    return PartitionRow(topic, p, leader=0, replicas=(0,), isr=(0,), log_start=start, high_watermark=hw,
                        last_stable=lso)


def _producer(tp, pid: int, start_offset: int) -> ProducerInfo:
    return ProducerInfo(tp[0], tp[1], pid, 0, 3, NOW - 5_000, 7, start_offset)


def test_open_transaction_holds_the_lso_where_it_started():
    snap = _snap(_part("t", 0, hw=10, lso=4), _part("t", 1, hw=6, lso=6))
    d = TxnDescription("copier", KafkaError.NONE, "Ongoing", 42, 1, 60_000, NOW - 3_000, (("t", 0), ("t", 1)))
    producers = {("t", 0): [_producer(("t", 0), 42, 4)], ("t", 1): []}
    (row,) = open_transactions([(2, d)], producers, snap)
    assert (row.transactional_id, row.coordinator, row.holds, row.hanging) == ("copier", 2, {("t", 0): 6}, "")
    assert row.age_s(NOW) == 3.0 and row.start_offsets == {("t", 0): 4} and row.coordinator_epoch == 7


def test_hanging_past_its_timeout_and_producer_state_without_a_coordinator():
    snap = _snap(_part("t", 0, hw=10, lso=2), _part("u", 0, hw=9, lso=9))
    overdue = TxnDescription("late", KafkaError.NONE, "Ongoing", 1, 0, 10_000, NOW - 11_000, (("u", 0),))
    producers = {("t", 0): [_producer(("t", 0), 99, 2)]}
    rows = {r.key: r for r in open_transactions([(0, overdue)], producers, snap)}
    assert rows["late"].hanging.startswith("open 11 s, past its 10 s timeout")
    orphan = rows["pid-99"]
    assert orphan.transactional_id is None and orphan.partitions == (("t", 0),) and orphan.holds == {("t", 0): 8}
    assert "no coordinator transaction" in orphan.hanging
    assert "Write an ABORT marker for producer 99" in actions.abort_plan(orphan)
    assert "Abort transaction 'late' (producer 1, epoch 0) at its coordinator" in actions.abort_plan(rows["late"])


def test_a_coordinator_transaction_that_does_not_name_the_partition_is_still_an_orphan_there():
    snap = _snap(_part("t", 0, hw=5, lso=1))
    d = TxnDescription("other", KafkaError.NONE, "Ongoing", 7, 0, 60_000, NOW, (("t", 1),))
    rows = open_transactions([(0, d)], {("t", 0): [_producer(("t", 0), 7, 1)]}, snap)
    assert sorted(r.key for r in rows) == ["other", "pid-7"]


def test_throughput_counts_partitions_both_views_read():
    before = _snap(_part("t", 0, hw=10, lso=10), _part("t", 1, hw=50, lso=50))
    # t-1's leader did not answer the second time (-1): not counted as 50 records lost or gained
    after = _snap(_part("t", 0, hw=25, lso=25), _part("t", 1, hw=-1, lso=-1), _part("t", 2, hw=7, lso=7))
    assert appended(before, after) == 15


def test_reset_plan_refuses_a_group_with_members_and_plans_each_partition():
    snap = _snap(_part("t", 0, hw=100, lso=90, start=20))
    member = GroupMember("m-1", None, "c", "/127.0.0.1")
    snap.groups = [GroupRow("busy", "Stable", "consumer", "range", "classic", 0, (member,), [LagRow("t", 0, 30, 100, 90)]),
                   GroupRow("idle", "Empty", "consumer", "", "classic", 0, (), [LagRow("t", 0, 30, 100, 90)])]
    with pytest.raises(actions.ActionError, match="Stable with 1 member"):
        actions.reset_plan(snap, "busy", "earliest")
    assert actions.reset_plan(snap, "idle", "earliest") == {("t", 0): 20}
    assert actions.reset_plan(snap, "idle", "latest") == {("t", 0): 100}


def test_check_history_as_a_timeline(tmp_path):
    events = [{"process": "nemesis", "type": "info", "f": "setup", "value": {}, "time": 1e8, "index": 0},
              {"process": "nemesis", "type": "invoke", "f": "kill-broker", "value": {"down_s": 0.5}, "time": 1.2e9,
               "index": 1},
              {"process": 1, "type": "ok", "f": "txn", "time": 0.5e9, "index": 2},
              {"process": 1, "type": "ok", "f": "txn", "time": 2.5e9, "index": 3},
              {"process": 2, "type": "info", "f": "txn", "time": 2.7e9, "index": 4}]
    history = tmp_path / "history.jsonl"
    history.write_text("".join(json.dumps(e) + "\n" for e in events))
    summary = {"anomalies": {"lost-write": [{"writer": {"index": 3, "time": 2.5e9}, "read_past_by":
                                             {"index": 9, "time": 3.0e9}}]}}
    t = timeline(history, summary)
    assert t["t"] == [0.0, 1.0, 2.0] and t["ok"] == [1, 0, 1] and t["info"] == [0, 0, 1] and t["fail"] == [0, 0, 0]
    assert t["faults"] == [(1.2, "kill-broker down_s=0.5")]
    assert t["anomalies"] == [(2.5, "lost-write")]

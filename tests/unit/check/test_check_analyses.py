"""The checker on hand-made histories: one per anomaly class, and clean ones.

Keys 0 and 1 are partitions; values are unique integers. Offsets leave gaps
where transaction markers would sit, as on a real broker.
"""
from __future__ import annotations


from semel.check.checker import analyze
from semel.check.history import from_events

from check_histbuilder import H

RC, RU = "read_committed", "read_uncommitted"


def found(h: H) -> set:
    result = analyze(from_events(h.events))
    return {name for name, n in result["anomaly_counts"].items() if n}


def cases(h: H, name: str) -> list:
    return analyze(from_events(h.events))["anomalies"].get(name, [])


def clean() -> H:
    """Two producers with overlapping transactions, an abort, readers at both
    isolations, a group consumer that rebalances and rereads: all legal."""
    h = H()
    # p1 and p2 overlap in time and interleave their records differently in
    # keys 0 and 1: legal in Kafka, which does not order concurrent transactions.
    h.txn_begin(1, [(0, 100, None), (1, 101, None)], txn_id="a")
    h.txn_begin(2, [(0, 200, None), (1, 201, None)], txn_id="b")
    h.txn_end(1, [(0, 100, 0), (1, 101, 2)], commit_ns=h.t + 1, txn_id="a")
    h.txn_end(2, [(0, 200, 1), (1, 201, 0)], commit_ns=h.t + 1, txn_id="b")
    # p1 aborts its next transaction; the records are in the log, then hidden.
    h.txn(1, [(0, 102, 4), (1, 103, 4)], type="fail", txn_id="a")
    # p1 then reads what p2 committed and writes again (consume-transform-produce).
    h.txn(1, [(0, 104, 6)], reads={1: [(0, 201), (2, 101)]}, txn_id="a", commit_ns=h.t + 15)
    # read_committed readers see committed values only, skipping aborted ones.
    h.assign(3, [0, 1])
    h.poll(3, {0: [(0, 100), (1, 200)], 1: [(0, 201)]})
    h.poll(3, {0: [(6, 104)], 1: [(2, 101)]})
    # read_uncommitted readers see aborted records too.
    h.assign(4, [0, 1])
    h.poll(4, {0: [(0, 100), (1, 200), (4, 102), (6, 104)], 1: [(0, 201), (2, 101), (4, 103)]}, iso=RU)
    # a group consumer rebalances and legally rereads from its committed offset.
    h.poll(5, {0: [(0, 100), (1, 200)]})
    h.poll(5, {0: [(1, 200), (6, 104)]}, rebalance=[[0]])
    # ...also when the poll that reports the rebalance returns nothing (its commit failed
    # as the whole cluster went down, so it reads again from the last committed offset).
    h.poll(5, {}, rebalance=[[0]])
    h.poll(5, {0: [(6, 104)]})
    return h


def test_clean_history_has_no_anomalies():
    result = analyze(from_events(clean().events))
    assert result["valid"], result["anomalies"]
    assert set(result["anomaly_counts"]) == {
        "aborted-read", "lost-write", "duplicate", "inconsistent-offsets", "torn-transaction",
        "precommitted-read", "poll-skip", "nonmonotonic-poll", "nonmonotonic-send", "G0", "G1c",
        "unseen", "unexpected-value", "incomplete"}
    assert result["stats"]["values_sent"] == 7


def test_aborted_read():
    h = clean()
    h.poll(6, {0: [(4, 102)]})  # read_committed, yet sees the aborted 102
    assert found(h) == {"aborted-read"}
    (case,) = cases(h, "aborted-read")
    assert (case["key"], case["value"], case["offset"]) == (0, 102, 4)


def test_aborted_values_are_fine_at_read_uncommitted():
    h = clean()
    h.poll(6, {0: [(4, 102)]}, iso=RU)
    assert found(h) == set()


def test_lost_write():
    h = H()
    h.txn(1, [(0, 10, 0)])
    h.txn(1, [(0, 11, 2)])
    h.txn(1, [(0, 12, 4)])
    h.poll(2, {0: [(0, 10)]})
    h.assign(2, [0])          # a fresh assignment may start anywhere...
    h.poll(2, {0: [(4, 12)]})  # ...but nobody ever reads 11, which sits below 12
    assert found(h) == {"lost-write", "unseen"}
    lost = cases(h, "lost-write")
    assert [(c["value"], c["isolation"]) for c in lost] == [(11, RC)]


def test_duplicate():
    h = H()
    h.txn(1, [(0, 10, 0), (0, 11, 1)])
    h.poll(2, {0: [(0, 10), (1, 11), (3, 11)]})  # 11 appears again at offset 3
    assert found(h) == {"duplicate"}
    assert cases(h, "duplicate")[0]["offsets"] == [1, 3]


def test_inconsistent_offsets():
    h = H()
    h.txn(1, [(0, 10, 0), (0, 11, 1)])
    h.txn(2, [(0, 20, 1)])  # the broker told p2 that offset 1 is also its record
    h.poll(3, {0: [(0, 10), (1, 11), (2, 21)]})
    h.txn(4, [(0, 21, 2)])
    assert "inconsistent-offsets" in found(h)
    assert cases(h, "inconsistent-offsets")[0] == {"key": 0, "offset": 1, "values": [11, 20]}


def test_poll_skip():
    h = H()
    h.txn(1, [(0, 10, 0), (0, 11, 1), (0, 12, 2)])
    h.poll(2, {0: [(0, 10)]})
    h.poll(2, {0: [(2, 12)]})                    # skipped 11
    h.poll(3, {0: [(0, 10), (1, 11), (2, 12)]})  # someone else did read it
    assert found(h) == {"poll-skip"}
    (case,) = cases(h, "poll-skip")
    assert case["skipped"] == {"values": [11], "count": 1} and not case["within_op"]


def test_poll_skip_within_one_poll():
    h = H()
    h.txn(1, [(0, 10, 0), (0, 11, 1), (0, 12, 2)])
    h.poll(2, {0: [(0, 10), (2, 12)]})
    h.poll(3, {0: [(0, 10), (1, 11), (2, 12)]})
    assert found(h) == {"poll-skip"}
    assert cases(h, "poll-skip")[0]["within_op"]


def test_nonmonotonic_poll():
    h = H()
    h.txn(1, [(0, 10, 0), (0, 11, 1)])
    h.poll(2, {0: [(0, 10), (1, 11)]})
    h.poll(2, {0: [(1, 11)]})  # the same consumer goes back without a reassignment
    assert found(h) == {"nonmonotonic-poll"}
    assert cases(h, "nonmonotonic-poll")[0]["delta"] == 0


def test_rebalance_allows_rereading():
    h = H()
    h.txn(1, [(0, 10, 0), (0, 11, 1)])
    h.poll(2, {0: [(0, 10), (1, 11)]})
    h.poll(2, {0: [(0, 10)]}, rebalance=[[0]])
    assert found(h) == set()


def test_nonmonotonic_send():
    h = H()
    h.txn(1, [(0, 10, 1)])
    h.txn(1, [(0, 11, 0)])  # the broker put p1's later record before its earlier one
    h.poll(2, {0: [(0, 11), (1, 10)]})
    assert found(h) == {"nonmonotonic-send"}
    (case,) = cases(h, "nonmonotonic-send")
    assert case["from"] == [1, 10] and case["to"] == [0, 11]


def test_precommitted_read_of_own_write():
    h = H()
    h.txn(1, [(0, 10, 0)], reads={0: [(0, 10)]}, poll_first=False)
    h.poll(2, {0: [(0, 10)]})
    assert found(h) == {"precommitted-read"}
    assert cases(h, "precommitted-read")[0]["kind"] == "own-write"


def test_precommitted_read_before_commit():
    h = H()
    h.txn_begin(1, [(0, 10, None)], at=10)
    h.poll(2, {0: [(0, 10)]})  # returns at t=30, the writer asks to commit at t=50
    h.txn_end(1, [(0, 10, 0)], at=60, commit_ns=50)
    assert found(h) == {"precommitted-read"}
    (case,) = cases(h, "precommitted-read")
    assert case["kind"] == "before-commit" and case["commit_ns"] == 50


def test_unseen():
    h = H()
    h.txn(1, [(0, 10, 0)])
    h.txn(1, [(0, 11, 2)])
    h.poll(2, {0: [(0, 10)]})  # no reader ever got as far as 11
    assert found(h) == {"unseen"}
    assert [c["value"] for c in cases(h, "unseen")] == [11]


def test_torn_transaction():
    h = H()
    # p1 crashes during commit: outcome unknown...
    h.txn(1, [(0, 10, 0), (1, 11, 0)], type="info")
    h.txn(2, [(1, 20, 2)])
    # ...its record in key 0 is visible, its record in key 1 is passed over.
    h.poll(3, {0: [(0, 10)], 1: [(2, 20)]})
    assert found(h) == {"torn-transaction", "lost-write"}
    (case,) = cases(h, "torn-transaction")
    assert case["seen"] == [[0, 10]] and case["passed_over"] == [[1, 11, 0]]


def test_g0_write_cycle():
    h = H()
    # T1 completes before T2 begins, yet T2's record precedes T1's in key 1.
    h.txn(1, [(0, 10, 0), (1, 11, 1)])
    h.txn(2, [(0, 20, 1), (1, 21, 0)])
    h.poll(3, {0: [(0, 10), (1, 20)], 1: [(0, 21), (1, 11)]})
    assert found(h) == {"G0"}
    (cycle,) = cases(h, "G0")
    assert {s["edge"] for s in cycle["steps"]} == {"ww"} and len(cycle["steps"]) == 2


def test_g0_same_transactional_id_across_incarnations():
    h = H()
    h.txn(1, [(0, 10, 1), (1, 11, 0)], type="info", txn_id="a")  # crashed; outcome unknown
    h.txn(2, [(0, 20, 0), (1, 21, 1)], txn_id="a")              # the next incarnation
    h.poll(3, {0: [(0, 20), (1, 10)], 1: [(0, 11), (1, 21)]})
    assert found(h) == {"G0"}


def test_g1c_read_cycle():
    h = H()
    # Two concurrent transactions each read the other's record: each would
    # have had to commit before the other.
    h.txn_begin(1, [(0, 10, None)])
    h.txn_begin(2, [(1, 20, None)])
    h.txn_end(1, [(0, 10, 0)], reads={1: [(0, 20)]})
    h.txn_end(2, [(1, 20, 0)], reads={0: [(0, 10)]})
    h.poll(3, {0: [(0, 10)], 1: [(0, 20)]})
    assert found(h) == {"G1c"}
    (cycle,) = cases(h, "G1c")
    assert [s["edge"] for s in cycle["steps"]] == ["wr", "wr"]


def test_g1c_mixed_ww_wr_cycle():
    h = H()
    # T1 finishes, then T2 writes after it in key 0 (ww T1->T2); but T1 read T2's record.
    h.txn_begin(1, [(0, 10, None)], at=10)
    h.txn_end(1, [(0, 10, 0)], reads={1: [(0, 21)]}, at=20)
    h.txn(2, [(0, 20, 1), (1, 21, 0)])
    h.poll(3, {0: [(0, 10), (1, 20)], 1: [(0, 21)]})
    assert "G1c" in found(h)
    edges = sorted(s["edge"] for s in cases(h, "G1c")[0]["steps"])
    assert edges == ["wr", "ww"]


def test_unexpected_value():
    h = clean()
    h.poll(6, {0: [(9, 999)]})
    assert found(h) == {"unexpected-value"}


def test_case_lists_are_capped_but_counts_exact():
    h = H()
    sends = [(0, 100 + i, i) for i in range(80)]
    h.txn(1, sends, type="fail")
    h.poll(2, {0: [(i, 100 + i) for i in range(80)]})
    result = analyze(from_events(h.events), max_cases=5)
    assert result["anomaly_counts"]["aborted-read"] == 80
    assert len(result["anomalies"]["aborted-read"]) == 5


def test_unfinished_drain_makes_the_run_incomplete():
    h = clean()
    h.events.append({"process": "nemesis", "type": "info", "f": "drain-incomplete",
                     "value": {"slot": "drain-rc", "at_end": [0]}, "time": h.t + 1})
    assert found(h) == {"incomplete"}
    assert cases(h, "incomplete")[0]["detail"]["at_end"] == [0]

"""The pure replication rules of semel.cluster.replica_rules on hand-made cases: who is
in the ISR, where the high watermark is, where a follower's log diverged from its
leader's and where it cuts, and leader-epoch fencing. tests/cluster/
test_replication_model.py and test_truncation_model.py drive the same rules through
seeded interleavings."""
from __future__ import annotations

from semel.cluster.replica_rules import (FollowerProgress, diverging_epoch, high_watermark, isr_change,
                                         leader_epoch_error, truncation_point)
from semel.cluster.state import PartitionState
from semel.protocol.errors import KafkaError
from semel.storage import FileSystem
from semel.storage.leader_epoch import LeaderEpochCache


def test_shrink_then_expand_decisions():
    """The decision itself on hand-made cases: lagging members leave, caught-up ones join, the leader stays."""
    st = PartitionState("t", 0, (0, 1, 2), 0, 3, (0, 1, 2))
    fresh, stale = FollowerProgress(leo=10, last_caught_up_ms=1000), FollowerProgress(leo=4, last_caught_up_ms=0)
    assert isr_change(st, 10, 10, {1: fresh, 2: stale}, 1000, 500, 0) == (0, 1)
    out = PartitionState("t", 0, (0, 1, 2), 0, 3, (0,))
    assert isr_change(out, 10, 10, {1: fresh, 2: stale}, 1000, 500, 0) == (0, 1)
    # One that left the ISR (here: killed on an idle partition, its last fetch at the log
    # end) joins again only on a fetch made after it left, not on that old fetch.
    gone = FollowerProgress(leo=10, last_caught_up_ms=1000, last_fetch_ms=1000, left_isr_ms=1100)
    assert isr_change(out, 10, 10, {1: gone}, 1200, 500, 0) is None
    gone.on_fetch(10, 10, now_ms=1300)
    assert isr_change(out, 10, 10, {1: gone}, 1300, 500, 0) == (0, 1)
    # A follower below the start of the leader's epoch does not join yet (Kafka's rule).
    assert isr_change(out, 12, 8, {1: FollowerProgress(leo=9, last_caught_up_ms=1000)}, 1000, 500, 11) is None
    assert isr_change(st, 10, 10, {1: fresh, 2: FollowerProgress(leo=10, last_caught_up_ms=900)}, 1000, 500, 0) is None
    # Lagging followers all gone: the leader alone, never an empty ISR.
    assert isr_change(st, 10, 10, {1: stale, 2: stale}, 1000, 500, 0) == (0,)
    # A caught-up follower whose broker session ended is not taken back in (KIP-841);
    # one still in the ISR is left to the lag rule (and the controller) to drop.
    assert isr_change(out, 10, 10, {1: fresh}, 1000, 500, 0, alive={0, 2}) is None
    assert isr_change(out, 10, 10, {1: fresh}, 1000, 500, 0, alive={0, 1, 2}) == (0, 1)
    # Kafka's caught-up rule: behind the current end but at the end of the previous fetch.
    p = FollowerProgress()
    p.on_fetch(5, 8, now_ms=100)
    assert p.last_caught_up_ms == 0
    p.on_fetch(8, 12, now_ms=200)
    assert p.last_caught_up_ms == 100
    assert high_watermark(3, 0, 12, (0, 1), {1: p}) == 8
    assert high_watermark(9, 0, 12, (0, 1), {1: p}) == 9       # never backwards


def test_leader_epoch_fencing():
    """KIP-320: an older epoch is fenced, a newer one unknown here, -1 asks for any."""
    assert leader_epoch_error(-1, 5) is KafkaError.NONE
    assert leader_epoch_error(5, 5) is KafkaError.NONE
    assert leader_epoch_error(4, 5) is KafkaError.FENCED_LEADER_EPOCH
    assert leader_epoch_error(0, 5) is KafkaError.FENCED_LEADER_EPOCH
    assert leader_epoch_error(6, 5) is KafkaError.UNKNOWN_LEADER_EPOCH
    assert leader_epoch_error(0, -1) is KafkaError.UNKNOWN_LEADER_EPOCH   # nothing known here yet
    assert leader_epoch_error(-1, -1) is KafkaError.NONE


def test_the_leader_tells_a_follower_where_their_logs_diverged(tmp_path):
    leader = LeaderEpochCache(FileSystem(), tmp_path, [(1, 0), (3, 10), (4, 25)])
    # The follower's log continues the leader's: no answer, the read decides.
    assert diverging_epoch(leader, 0, 40, 40, 4) is None
    assert diverging_epoch(leader, 0, 40, 20, 3) is None
    # No epoch (an empty follower log) or below the leader's log start: the read decides.
    assert diverging_epoch(leader, 0, 40, 0, -1) is None
    assert diverging_epoch(leader, 15, 40, 12, 3) is None
    # Past where that epoch ends here: cut to its end.
    assert diverging_epoch(leader, 0, 40, 30, 3) == (3, 25)
    # An epoch the leader never had: the largest below it, and where that ends.
    assert diverging_epoch(leader, 0, 40, 12, 2) == (1, 10)
    # Above every epoch the leader knows.
    assert diverging_epoch(leader, 0, 40, 45, 5) is KafkaError.OFFSET_OUT_OF_RANGE


def test_the_follower_cuts_where_both_logs_agree(tmp_path):
    follower = LeaderEpochCache(FileSystem(), tmp_path, [(1, 0), (3, 10)])
    # The leader has the follower's latest epoch, ending earlier: cut there, done.
    assert truncation_point(follower, 20, 5, 3, 15) == (15, True)
    assert truncation_point(follower, 20, 5, 3, 30) == (20, True)
    # The leader's answer names an epoch the follower lacks: cut to where the follower's
    # history above it begins and ask again.
    assert truncation_point(follower, 20, 5, 2, 12) == (10, False)
    # No common epoch: keep what is committed (the high watermark).
    assert truncation_point(follower, 20, 5, -1, -1) == (5, True)
    # A follower with records but no epochs takes the leader's end.
    blind = LeaderEpochCache(FileSystem(), tmp_path)
    assert truncation_point(blind, 20, 5, 2, 7) == (7, True)
    assert truncation_point(blind, 4, 0, 2, 7) == (4, True)

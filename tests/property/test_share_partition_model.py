"""Model-based test of one share-partition (KIP-932): random acquisitions by several
members, acknowledgements of every type (including of records another member holds,
and one type per offset, which splits an acquired range into pieces), renewals of acquisition locks (KIP-1222), lock expiry as time passes, members leaving, records that are not deliverable (markers,
aborted records), and restarts (the state rebuilt from its durable form alone). No
event loop: the share-partition is plain Python and time is a number.

After every step:
  - a record is acquired by at most one member, and only within its lock;
  - a renewed record keeps its member and its delivery count, its lock deadline is the
    renewal time + the lock duration;
  - an acknowledged or archived record is never delivered again;
  - a delivery count never exceeds the limit;
  - the start offset never passes an unfinished record (every offset below it was
    acknowledged or archived), and the window never holds more than the lock limit;
  - what is durable, rebuilt, gives the same window and the same finished records;
  - the state is kept per range: spans back to back over the window, neighbours that
    ended alike joined again.
"""
from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from semel.coordinator.share_partition import (
    ACK_ACCEPT, ACK_GAP, ACK_REJECT, ACK_RELEASE, ACK_RENEW, ACKNOWLEDGED, ACQUIRED, ARCHIVED, FINISHED, Limits,
    SharePartition,
)
from semel.protocol.errors import KafkaError

MEMBERS = ["m1", "m2", "m3"]
LIMITS = Limits(lock_ms=100, delivery_limit=3, max_in_flight=12)


class SharePartitionModel(RuleBasedStateMachine):
    @initialize(start=st.integers(0, 5))
    def begin(self, start):
        self.sp = SharePartition(start)
        self.initial_start = start
        self.deleted_below = 0
        self.log_end = start
        self.now = 0
        self.undeliverable: set[int] = set()
        # The model: what each offset ended as, and every delivery made.
        self.finished: dict[int, int] = {}          # offset -> ACKNOWLEDGED / ARCHIVED
        self.deliveries: dict[int, int] = {}        # offset -> deliveries seen
        self.holder: dict[int, tuple[str, int]] = {}  # offset -> (member, lock deadline)
        self.renewed: set[int] = set()              # offsets whose lock was renewed at least once

    # --- the log grows -------------------------------------------------------------------

    @rule(n=st.integers(1, 6), marker=st.booleans())
    def produce(self, n, marker):
        if marker:   # a transaction marker or an aborted record: never delivered
            self.undeliverable.add(self.log_end)
        self.log_end += n

    @rule(ms=st.integers(1, 150))
    def time_passes(self, ms):
        self.now += ms

    # --- acquire --------------------------------------------------------------------------

    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(1, 8), aligned=st.booleans())
    def acquire(self, member, max_records, aligned):
        """`aligned`: log batches of 4 offsets, acquired whole (past max_records if need be)."""
        self._expire_model()
        got = self.sp.acquire(member, self.log_end, max_records, self.now, LIMITS, self.undeliverable,
                              set(range(0, self.log_end + 1, 4)) if aligned else None)
        offsets = [(off, count) for first, last, count in got for off in range(first, last + 1)]
        assert len(offsets) <= max_records + (3 if aligned else 0)
        assert all(first <= last for first, last, _ in got)
        for off, count in offsets:
            assert off not in self.finished, f"{off} delivered after it finished"
            assert off not in self.undeliverable, f"{off} holds nothing to deliver"
            assert off not in self.holder, f"{off} acquired twice"
            self.deliveries[off] = self.deliveries.get(off, 0) + 1
            assert count == self.deliveries[off] <= LIMITS.delivery_limit
            self.holder[off] = (member, self.now + LIMITS.lock_ms)
        for off in self.undeliverable:
            if off < self.sp.end:
                self.finished.setdefault(off, ARCHIVED)

    def _expire_model(self):
        for off, (_, deadline) in list(self.holder.items()):
            if deadline <= self.now:
                self._released(off)

    def _released(self, off):
        del self.holder[off]
        if self.deliveries[off] >= LIMITS.delivery_limit:
            self.finished[off] = ARCHIVED

    # --- acknowledge --------------------------------------------------------------------

    @rule(member=st.sampled_from(MEMBERS), data=st.data(),
          kind=st.sampled_from([ACK_ACCEPT, ACK_RELEASE, ACK_REJECT, ACK_GAP]))
    def acknowledge(self, member, data, kind):
        if self.log_end == 0:
            return
        self.sp.expire(self.now, LIMITS)
        self._expire_model()
        first, last = self._draw_range(data, member)
        err = self.sp.acknowledge(member, first, last, [kind], LIMITS)
        held = all(self.holder.get(off, ("", 0))[0] == member for off in range(first, last + 1))
        if not held:
            assert err == KafkaError.INVALID_RECORD_STATE   # all or nothing
            return
        assert err == KafkaError.NONE
        for off in range(first, last + 1):
            if kind == ACK_RELEASE:
                self._released(off)
            else:
                del self.holder[off]
                self.finished[off] = ACKNOWLEDGED if kind == ACK_ACCEPT else ARCHIVED

    @rule(member=st.sampled_from(MEMBERS), data=st.data(),
          kinds=st.lists(st.sampled_from([ACK_ACCEPT, ACK_RELEASE, ACK_REJECT, ACK_GAP]), min_size=4, max_size=4))
    def acknowledge_per_offset(self, member, data, kinds):
        """One type per offset: part of an acquired range accepted, part released or
        rejected, so the range splits, and the pieces that end alike join again."""
        if self.log_end == 0:
            return
        self.sp.expire(self.now, LIMITS)
        self._expire_model()
        first, last = self._draw_range(data, member)
        types = kinds[:last - first + 1]
        err = self.sp.acknowledge(member, first, last, types, LIMITS)
        if not all(self.holder.get(off, ("", 0))[0] == member for off in range(first, last + 1)):
            assert err == KafkaError.INVALID_RECORD_STATE   # all or nothing
            return
        assert err == KafkaError.NONE
        for off, kind in zip(range(first, last + 1), types):
            if kind == ACK_RELEASE:
                self._released(off)
            else:
                del self.holder[off]
                self.finished[off] = ACKNOWLEDGED if kind == ACK_ACCEPT else ARCHIVED

    @rule(member=st.sampled_from(MEMBERS), data=st.data())
    def renew(self, member, data):
        """Renew a range: all or nothing, held only by `member` within its lock."""
        if self.log_end == 0:
            return
        self._renew(member, *self._draw_range(data, member))

    @rule(member=st.sampled_from(MEMBERS), wait=st.integers(1, LIMITS.lock_ms - 1))
    def acquire_then_renew(self, member, wait):
        """A member renews, before its lock runs out, the first record it acquired."""
        self.produce(4, False)
        self.acquire(member, 4, False)
        self.time_passes(wait)
        held = sorted(off for off, (who, deadline) in self.holder.items() if who == member and deadline > self.now)
        if held:
            self._renew(member, held[0], held[0])

    def _renew(self, member, first, last):
        before = {off: (r.member, r.count) for off, r in self.sp.records.items()}
        err = self.sp.acknowledge(member, first, last, [ACK_RENEW], LIMITS, renew_at=self.now)
        held = all(self.holder.get(off, ("", 0))[0] == member and self.holder[off][1] > self.now
                   for off in range(first, last + 1))
        if not held:
            assert err == KafkaError.INVALID_RECORD_STATE
            return
        assert err == KafkaError.NONE
        for off in range(first, last + 1):
            r = self.sp.records[off]
            assert (r.state, r.member, r.count) == (ACQUIRED, member, before[off][1])
            assert r.deadline == self.now + LIMITS.lock_ms
            self.holder[off] = (member, r.deadline)
        self.renewed.update(range(first, last + 1))

    @rule(member=st.sampled_from(MEMBERS), data=st.data())
    def renew_without_v2(self, member, data):
        """A request that may not carry renew (v1): INVALID_REQUEST, nothing changes."""
        if self.log_end == 0:
            return
        off = data.draw(st.integers(0, self.log_end - 1))
        before = {o: (r.state, r.member, r.count, r.deadline) for o, r in self.sp.records.items()}
        assert self.sp.acknowledge(member, off, off, [ACK_RENEW], LIMITS) == KafkaError.INVALID_REQUEST
        assert before == {o: (r.state, r.member, r.count, r.deadline) for o, r in self.sp.records.items()}

    def _draw_range(self, data, member):
        """Up to 4 offsets: most often starting at a record `member` holds (so that
        acknowledgements succeed), otherwise anywhere in the log."""
        held = sorted(off for off, (who, deadline) in self.holder.items() if who == member and deadline > self.now)
        if held and data.draw(st.booleans()):
            first = data.draw(st.sampled_from(held))
        else:
            first = data.draw(st.integers(0, self.log_end - 1))
        return first, data.draw(st.integers(first, min(first + 3, self.log_end - 1)))

    @rule(member=st.sampled_from(MEMBERS))
    def member_leaves(self, member):
        self.sp.release_member(member, LIMITS)
        for off, (who, _) in list(self.holder.items()):
            if who == member:
                self._released(off)

    @rule(n=st.integers(1, 6))
    def retention_deletes(self, n):
        """The log's start moves up (retention, DeleteRecords): nothing below it is
        delivered again, held or not."""
        cut = min(self.sp.start + n, self.log_end)
        self.sp.skip_to(cut)
        self.deleted_below = max(self.deleted_below, cut)
        for off in [o for o in self.holder if o < cut]:
            del self.holder[off]
        for off in range(cut):
            self.finished.setdefault(off, ARCHIVED)   # gone: never delivered again

    @rule()
    def restart(self):
        """Only the durable form survives: what was acquired is available again."""
        start, end, runs = self.sp.durable(LIMITS)
        self.sp = SharePartition.restore(start, end, runs)
        for off in list(self.holder):
            del self.holder[off]
            if self.deliveries[off] >= LIMITS.delivery_limit:
                self.finished[off] = ARCHIVED

    # --- invariants ---------------------------------------------------------------------

    @invariant()
    def at_most_one_holder_within_its_lock(self):
        acquired = {off: r for off, r in self.sp.records.items() if r.state == ACQUIRED}
        assert set(acquired) <= set(self.holder) | {o for o, r in acquired.items() if r.deadline <= self.now}
        for off, r in acquired.items():
            if r.deadline > self.now:
                assert self.holder[off][0] == r.member

    @invariant()
    def held_records_match_the_model(self):
        """Every record held within its lock has the model's one member, deadline and
        delivery count: a renewal moved the deadline and nothing else, and no record is
        held by two members."""
        for off, (who, deadline) in self.holder.items():
            r = self.sp.records.get(off)
            if deadline > self.now and r is not None and r.state == ACQUIRED:
                assert (r.member, r.deadline, r.count) == (who, deadline, self.deliveries[off]), off
        live = [off for off, r in self.sp.records.items() if r.state == ACQUIRED and r.deadline > self.now]
        assert all(self.holder[off][0] == self.sp.records[off].member for off in live)
        for off in self.renewed & set(live):
            assert self.sp.records[off].count == self.deliveries[off]

    @invariant()
    def finished_records_stay_finished(self):
        for off, state in self.finished.items():
            r = self.sp.records.get(off)
            assert off < self.sp.start or off < self.deleted_below or (r is not None and r.state == state), off

    @invariant()
    def delivery_counts_within_the_limit(self):
        assert all(r.count <= LIMITS.delivery_limit for r in self.sp.records.values())
        assert all(n <= LIMITS.delivery_limit for n in self.deliveries.values())

    @invariant()
    def start_never_passes_an_unfinished_record(self):
        sp = self.sp
        assert sp.start <= sp.end <= max(self.log_end, sp.end)
        assert sp.end - sp.start <= LIMITS.max_in_flight
        assert set(sp.records) == set(range(sp.start, sp.end))
        assert sp.start == sp.end or sp.records[sp.start].state not in FINISHED
        for off in range(self.initial_start, sp.start):
            assert off in self.finished, f"start {sp.start} passed unfinished {off}"

    @invariant()
    def spans_cover_the_window_once_and_join_alike_neighbours(self):
        """The per-range state: spans in order, back to back from start to end, none
        empty, and no two neighbours alike (a split is undone once its pieces agree)."""
        spans = self.sp.spans
        assert [s.first for s in spans[:1]] == ([self.sp.start] if self.sp.end > self.sp.start else [])
        assert all(s.first <= s.last for s in spans)
        assert all(a.last + 1 == b.first and not a.alike(b) for a, b in zip(spans, spans[1:]))
        assert (spans[-1].last + 1 if spans else self.sp.start) == self.sp.end
        assert all(s.state not in FINISHED for s in spans[:1])

    @invariant()
    def durable_form_round_trips(self):
        start, end, runs = self.sp.durable(LIMITS)
        back = SharePartition.restore(start, end, runs)
        # the same window (its start moves only past a last delivery whose lock died)
        assert back.end == self.sp.end and back.start >= self.sp.start
        for off, r in self.sp.records.items():
            if r.state in FINISHED:
                assert off < back.start or back.records[off].state == r.state
        assert SharePartition.restore(*back.durable(LIMITS)).durable(LIMITS) == back.durable(LIMITS)


TestSharePartitionModel = SharePartitionModel.TestCase
TestSharePartitionModel.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)

"""One share-partition (KIP-932): which records of a topic partition a share group
has delivered, to whom, and how each ended. Plain Python, no I/O and no clock of its
own: every operation takes `now` (milliseconds), so a test drives time.

The window is [start, end): `start` is the first offset not yet finished (acknowledged
or archived), `end` the first offset never acquired. The window is covered by spans:
runs of consecutive offsets in one state, with one delivery count, member and lock
deadline. A fetch acquires whole runs, so a span is usually a batch; an operation on
part of a span splits it there, and neighbours that end alike merge again. Work is per
span, never per record, so it does not grow with the records a batch holds. Offsets
at or past `end` are available with no delivery yet.

  available --acquire--> acquired (delivery count + 1, locked to one member until a deadline)
  acquired --accept--> acknowledged        acquired --reject--> archived
  acquired --release / lock expiry / member gone--> available, or archived once the
                                                   delivery count reached the limit
  acquired --renew (v2)--> acquired by the same member, its lock deadline now + the lock
                           duration, the delivery count unchanged

`start` moves past the contiguous prefix of acknowledged/archived records, and new
records are acquired only while the window holds fewer than `max_in_flight` offsets.
What survives a restart is `durable()`: the window and, per run of offsets, its state
and delivery count, an acquired record counting as released (its lock dies with the
broker, so it is delivered again, never lost, unless that was its last delivery).
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Collection, Iterable

from ..protocol.errors import KafkaError

# Record states (Kafka's numbering).
AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = 0, 1, 2, 4
FINISHED = (ACKNOWLEDGED, ARCHIVED)
# Acknowledge types on the wire.
ACK_GAP, ACK_ACCEPT, ACK_RELEASE, ACK_REJECT, ACK_RENEW = 0, 1, 2, 3, 4
ACK_TYPES = (ACK_GAP, ACK_ACCEPT, ACK_RELEASE, ACK_REJECT)

# One run of the durable form: (first offset, last offset, state, delivery count).
Run = tuple[int, int, int, int]
# Records acquired in one piece: (first offset, last offset, delivery count).
Acquired = tuple[int, int, int]


@dataclass(slots=True)
class InFlight:
    """One offset's state, as `SharePartition.records` shows it."""
    state: int
    count: int              # deliveries so far
    member: str | None = None
    deadline: int = 0       # lock expiry (ms) while acquired


@dataclass(slots=True)
class Span:
    """Offsets first..last (inclusive), all in one state."""
    first: int
    last: int
    state: int
    count: int
    member: str | None = None
    deadline: int = 0

    def size(self) -> int:
        return self.last - self.first + 1

    def alike(self, other: Span) -> bool:
        return self.state == other.state and self.count == other.count and self.member == other.member \
            and self.deadline == other.deadline


@dataclass(frozen=True, slots=True)
class Limits:
    lock_ms: int = 30_000
    delivery_limit: int = 5
    max_in_flight: int = 2_000


def _first(s: Span) -> int:
    return s.first


class SharePartition:
    def __init__(self, start: int) -> None:
        self.start = start
        self.end = start
        self.spans: list[Span] = []   # sorted, contiguous, exactly covering [start, end)

    @property
    def records(self) -> dict[int, InFlight]:
        """Every offset of the window with its state, one entry each (for checks and
        diagnostics: the operations themselves never expand spans)."""
        return {off: InFlight(s.state, s.count, s.member, s.deadline)
                for s in self.spans for off in range(s.first, s.last + 1)}

    # --- durable form ----------------------------------------------------------------

    def durable(self, limits: Limits) -> tuple[int, int, list[Run]]:
        """(start, end, runs): what a restart rebuilds. An acquired record counts as
        released (its lock dies with the broker): available again, or archived when
        this was its last delivery."""
        runs: list[Run] = []
        for s in self.spans:
            state = s.state
            if state == ACQUIRED:
                state = ARCHIVED if s.count >= limits.delivery_limit else AVAILABLE
            if runs and runs[-1][2:] == (state, s.count):
                runs[-1] = (runs[-1][0], s.last, state, s.count)
            else:
                runs.append((s.first, s.last, state, s.count))
        return self.start, self.end, runs

    @classmethod
    def restore(cls, start: int, end: int, runs: Iterable[Run]) -> SharePartition:
        sp = cls(start)
        sp.end = end
        at = start   # the first offset no span covers yet
        for first, last, state, count in sorted(runs):
            lo, hi = max(first, at), min(last, end - 1)
            if lo > hi:
                continue
            if lo > at:   # a hole in a record written by hand: available again
                sp.spans.append(Span(at, lo - 1, AVAILABLE, 0))
            sp.spans.append(Span(lo, hi, state, count))
            at = hi + 1
        if at < end:
            sp.spans.append(Span(at, end - 1, AVAILABLE, 0))
        sp._tidy()
        return sp

    # --- time and members --------------------------------------------------------------

    def expire(self, now: int, limits: Limits) -> int:
        """Release every acquired record whose lock ran out; returns how many."""
        due = [s for s in self.spans if s.state == ACQUIRED and s.deadline <= now]
        return self._release_all(due, limits)

    def release_member(self, member: str, limits: Limits) -> int:
        """The member left (or its session closed): what it holds is available again."""
        held = [s for s in self.spans if s.state == ACQUIRED and s.member == member]
        return self._release_all(held, limits)

    def _release_all(self, spans: list[Span], limits: Limits) -> int:
        for s in spans:
            self._release(s, limits)
        if spans:
            self._tidy()
        return sum(s.size() for s in spans)

    # --- acquire ---------------------------------------------------------------------------

    def acquire(self, member: str, fetchable_end: int, max_records: int, now: int, limits: Limits,
                skip: Collection[int] = (), batch_starts: Collection[int] | None = None) -> list[Acquired]:
        """Acquire up to `max_records` records below `fetchable_end` for `member`:
        released ones first (lowest offset first), then new ones while the window has
        room. The offsets in `skip` hold nothing to deliver (transaction markers,
        aborted records): they are archived on the way, never delivered. With
        `batch_starts` (the first offsets of the log's batches) new records are
        acquired up to a batch boundary, past `max_records` if need be, as Kafka
        aligns them. Returns the ranges acquired, with their delivery count."""
        self.expire(now, limits)
        got: list[Acquired] = []
        need = self._acquire_released(member, fetchable_end, max_records, now, limits, got)
        stop = self._new_end(need, min(fetchable_end, self.start + limits.max_in_flight), skip, batch_starts)
        at = self.end
        for hole in [*sorted(o for o in skip if at <= o < stop), stop]:
            if hole > at:
                s = Span(at, hole - 1, AVAILABLE, 0)
                self._lock(s, member, now, limits)
                self.spans.append(s)
                got.append((s.first, s.last, s.count))
            if hole < stop:
                self.spans.append(Span(hole, hole, ARCHIVED, 0))
            at = hole + 1
        self.end = max(self.end, stop)
        self._tidy()
        return got

    def _acquire_released(self, member: str, fetchable_end: int, need: int, now: int, limits: Limits,
                          got: list[Acquired]) -> int:
        """Acquire available records inside the window into `got`; returns how many
        more may be acquired."""
        i = 0
        while i < len(self.spans) and need > 0 and self.spans[i].first < fetchable_end:
            s = self.spans[i]
            if s.state == AVAILABLE:
                self._split_at(min(fetchable_end, s.first + need))
                if s.count >= limits.delivery_limit:   # restored at the limit: never again
                    self._finish(s, ARCHIVED)
                else:
                    self._lock(s, member, now, limits)
                    got.append((s.first, s.last, s.count))
                    need -= s.size()
            i += 1
        return need

    def _new_end(self, need: int, room: int, skip: Collection[int], batch_starts: Collection[int] | None) -> int:
        """Where new acquisitions stop: `need` deliverable offsets past `end` (the
        offsets in `skip` do not count), then on to a batch boundary; never past `room`."""
        at = self.end
        if at >= room:
            return at
        for hole in sorted(o for o in skip if at <= o < room):
            if need <= hole - at:
                break
            need -= hole - at
            at = hole + 1
        at = min(at + need, room)
        if batch_starts is not None and at < room and at not in batch_starts:
            at = min((b for b in batch_starts if at < b < room), default=room)
        return at

    # --- acknowledge ---------------------------------------------------------------------

    def acknowledge(self, member: str, first: int, last: int, types: list[int], limits: Limits,
                    renew_at: int | None = None) -> KafkaError:
        """Acknowledge [first, last] for `member`: one type for the whole range, or one
        per offset. All or nothing: any offset the member does not hold makes the batch
        INVALID_RECORD_STATE and changes nothing. Renew is a type only where the
        request may carry it (`renew_at`, the time now, given): it keeps the record with
        its member and moves its lock deadline to `renew_at` + the lock duration; a
        record whose lock already ran out is no longer held, so it cannot be renewed."""
        allowed = ACK_TYPES if renew_at is None else (*ACK_TYPES, ACK_RENEW)
        if last < first or not types or (len(types) != 1 and len(types) != last - first + 1) \
                or any(t not in allowed for t in types):
            return KafkaError.INVALID_REQUEST
        if first < self.start or last >= self.end:   # outside the window: nothing there is held
            return KafkaError.INVALID_RECORD_STATE
        runs = _type_runs(first, last, types)
        if not all(self._held(member, a, b, renew_at if kind == ACK_RENEW else None) for a, b, kind in runs):
            return KafkaError.INVALID_RECORD_STATE
        for a, b, kind in runs:
            for s in self._cut(a, b):
                if kind == ACK_RENEW and renew_at is not None:
                    self._renew(s, renew_at, limits)
                elif kind == ACK_ACCEPT:
                    self._finish(s, ACKNOWLEDGED)
                elif kind == ACK_RELEASE:
                    self._release(s, limits)
                else:   # reject, or a gap (no record there): never delivered again
                    self._finish(s, ARCHIVED)
        self._tidy()
        return KafkaError.NONE

    def _held(self, member: str, first: int, last: int, renew_at: int | None) -> bool:
        """Does `member` hold every offset of [first, last] (with a lock still running
        at `renew_at`, when given)?"""
        for s in self.spans[self._index(first):]:
            if s.first > last:
                break
            if s.state != ACQUIRED or s.member != member or (renew_at is not None and s.deadline <= renew_at):
                return False
        return True

    def skip_to(self, offset: int) -> None:
        """The log no longer holds what lies before `offset` (retention, DeleteRecords):
        the window starts there, whatever was in flight below it is gone."""
        if offset > self.start:
            self._split_at(offset)
            self.spans = [s for s in self.spans if s.first >= offset]
        self.start = max(self.start, offset)
        self.end = max(self.end, self.start)
        self._tidy()

    # --- counts (describe, metrics, lock timers) ---------------------------------------

    def counts(self) -> dict[str, int]:
        by = {AVAILABLE: 0, ACQUIRED: 0, ACKNOWLEDGED: 0, ARCHIVED: 0}
        for s in self.spans:
            by[s.state] += s.size()
        return {"in_flight": self.end - self.start, "available": by[AVAILABLE], "acquired": by[ACQUIRED],
                "acknowledged": by[ACKNOWLEDGED], "archived": by[ARCHIVED]}

    def next_deadline(self) -> int | None:
        """The earliest lock deadline (None: nothing acquired)."""
        return min((s.deadline for s in self.spans if s.state == ACQUIRED), default=None)

    # --- transitions: the only place a state changes -------------------------------------

    @staticmethod
    def _lock(s: Span, member: str, now: int, limits: Limits) -> None:
        s.state, s.member, s.deadline = ACQUIRED, member, now + limits.lock_ms
        s.count += 1

    @staticmethod
    def _renew(s: Span, now: int, limits: Limits) -> None:
        s.deadline = now + limits.lock_ms

    @staticmethod
    def _finish(s: Span, state: int) -> None:
        s.state, s.member, s.deadline = state, None, 0

    def _release(self, s: Span, limits: Limits) -> None:
        self._finish(s, ARCHIVED if s.count >= limits.delivery_limit else AVAILABLE)

    # --- spans ------------------------------------------------------------------------------

    def _index(self, offset: int) -> int:
        """The index of the span holding `offset` (inside the window)."""
        return bisect_right(self.spans, offset, key=_first) - 1

    def _split_at(self, offset: int) -> None:
        """Make `offset` the first of a span (an operation on part of a span)."""
        if offset <= self.start or offset >= self.end:
            return
        i = self._index(offset)
        s = self.spans[i]
        if s.first != offset:
            self.spans.insert(i + 1, Span(offset, s.last, s.state, s.count, s.member, s.deadline))
            s.last = offset - 1

    def _cut(self, first: int, last: int) -> list[Span]:
        """The spans exactly covering [first, last], split where they straddle its ends."""
        self._split_at(first)
        self._split_at(last + 1)
        return self.spans[self._index(first):self._index(last) + 1]

    def _tidy(self) -> None:
        """Merge neighbours that ended alike, then move `start` past the finished
        prefix (those spans are forgotten)."""
        merged: list[Span] = []
        for s in self.spans:
            if merged and merged[-1].alike(s):
                merged[-1].last = s.last
            else:
                merged.append(s)
        done = 0
        while done < len(merged) and merged[done].state in FINISHED:
            done += 1
        if done:
            self.start = merged[done - 1].last + 1
        self.spans = merged[done:]


def _type_runs(first: int, last: int, types: list[int]) -> list[tuple[int, int, int]]:
    """[first, last] as (first, last, acknowledge type) runs of one type each."""
    if len(types) == 1:
        return [(first, last, types[0])]
    runs: list[tuple[int, int, int]] = []
    for off, kind in enumerate(types, start=first):
        if runs and runs[-1][2] == kind:
            runs[-1] = (runs[-1][0], off, kind)
        else:
            runs.append((off, off, kind))
    return runs

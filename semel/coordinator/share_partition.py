"""One share-partition (KIP-932): which records of a topic partition a share group
has delivered, to whom, and how each ended. Plain Python, no I/O and no clock of its
own: every operation takes `now` (milliseconds), so a test drives time.

The window is [start, end): `start` is the first offset not yet finished (acknowledged
or archived), `end` the first offset never acquired. Every offset inside the window
has an `InFlight` entry; offsets at or past `end` are available with no delivery yet.

  available --acquire--> acquired (delivery count + 1, locked to one member until a deadline)
  acquired --accept--> acknowledged        acquired --reject--> archived
  acquired --release / lock expiry / member gone--> available, or archived once the
                                                   delivery count reached the limit
  acquired --renew (v2)--> acquired by the same member, its lock deadline now + the lock
                           duration, the delivery count unchanged

`start` moves past the contiguous prefix of acknowledged/archived records, and new
records are acquired only while the window holds fewer than `max_in_flight` offsets.
What survives a restart is `durable()`: the window and, per offset, its state and
delivery count, an acquired record counting as released (its lock dies with the
broker, so it is delivered again, never lost, unless that was its last delivery).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from ..protocol.errors import KafkaError

# Record states (Kafka's numbering).
AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = 0, 1, 2, 4
FINISHED = (ACKNOWLEDGED, ARCHIVED)
# Acknowledge types on the wire.
ACK_GAP, ACK_ACCEPT, ACK_RELEASE, ACK_REJECT, ACK_RENEW = 0, 1, 2, 3, 4
ACK_TYPES = (ACK_GAP, ACK_ACCEPT, ACK_RELEASE, ACK_REJECT)

# One run of the durable form: (first offset, last offset, state, delivery count).
Run = tuple[int, int, int, int]


@dataclass(slots=True)
class InFlight:
    state: int
    count: int              # deliveries so far
    member: str | None = None
    deadline: int = 0       # lock expiry (ms) while acquired


@dataclass(frozen=True, slots=True)
class Limits:
    lock_ms: int = 30_000
    delivery_limit: int = 5
    max_in_flight: int = 2_000


class SharePartition:
    def __init__(self, start: int) -> None:
        self.start = start
        self.end = start
        self.records: dict[int, InFlight] = {}

    # --- durable form ----------------------------------------------------------------

    def durable(self, limits: Limits) -> tuple[int, int, list[Run]]:
        """(start, end, runs): what a restart rebuilds. An acquired record counts as
        released (its lock dies with the broker): available again, or archived when
        this was its last delivery."""
        runs: list[Run] = []
        for off in range(self.start, self.end):
            r = self.records[off]
            state = r.state
            if state == ACQUIRED:
                state = ARCHIVED if r.count >= limits.delivery_limit else AVAILABLE
            if runs and runs[-1][1] == off - 1 and runs[-1][2:] == (state, r.count):
                runs[-1] = (runs[-1][0], off, state, r.count)
            else:
                runs.append((off, off, state, r.count))
        return self.start, self.end, runs

    @classmethod
    def restore(cls, start: int, end: int, runs: Iterable[Run]) -> SharePartition:
        sp = cls(start)
        sp.end = end
        for first, last, state, count in runs:
            for off in range(max(first, start), min(last, end - 1) + 1):
                sp.records[off] = InFlight(state, count)
        for off in range(start, end):   # a hole in a record written by hand: available again
            sp.records.setdefault(off, InFlight(AVAILABLE, 0))
        sp._advance()
        return sp

    # --- time and members --------------------------------------------------------------

    def expire(self, now: int, limits: Limits) -> int:
        """Release every acquired record whose lock ran out; returns how many."""
        due = [off for off, r in self.records.items() if r.state == ACQUIRED and r.deadline <= now]
        for off in due:
            self._release(self.records[off], limits)
        self._advance()
        return len(due)

    def release_member(self, member: str, limits: Limits) -> int:
        """The member left (or its session closed): what it holds is available again."""
        held = [r for r in self.records.values() if r.state == ACQUIRED and r.member == member]
        for r in held:
            self._release(r, limits)
        self._advance()
        return len(held)

    # --- acquire ---------------------------------------------------------------------------

    def acquire(self, member: str, fetchable_end: int, max_records: int, now: int, limits: Limits,
                skip: Callable[[int], bool] = lambda off: False,
                batch_start: Callable[[int], bool] | None = None) -> list[tuple[int, int]]:
        """Acquire up to `max_records` records below `fetchable_end` for `member`:
        released ones first (lowest offset first), then new ones while the window has
        room. `skip(offset)` says an offset holds nothing to deliver (a transaction
        marker, an aborted record): it is archived on the way, never delivered. With
        `batch_start` (is an offset the first of a log batch?) new records are acquired
        up to a batch boundary, past `max_records` if need be, as Kafka aligns them.
        Returns (offset, delivery count) of every record acquired."""
        self.expire(now, limits)
        got: list[tuple[int, int]] = []
        for off in sorted(o for o, r in self.records.items() if r.state == AVAILABLE and o < fetchable_end):
            if len(got) >= max_records:
                break
            r = self.records[off]
            if r.count >= limits.delivery_limit:   # restored at the limit: never again
                r.state = ARCHIVED
                continue
            self._lock(r, member, now, limits)
            got.append((off, r.count))
        while self.end < fetchable_end and self.end - self.start < limits.max_in_flight \
                and (len(got) < max_records or (batch_start is not None and not batch_start(self.end))):
            off = self.end
            self.end += 1
            if skip(off):
                self.records[off] = InFlight(ARCHIVED, 0)
                continue
            r = self.records[off] = InFlight(AVAILABLE, 0)
            self._lock(r, member, now, limits)
            got.append((off, r.count))
        self._advance()
        return got

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
        kinds = types * (last - first + 1) if len(types) == 1 else types
        for off, kind in zip(range(first, last + 1), kinds):
            r = self.records.get(off)
            if r is None or r.state != ACQUIRED or r.member != member \
                    or (kind == ACK_RENEW and renew_at is not None and r.deadline <= renew_at):
                return KafkaError.INVALID_RECORD_STATE
        for off, kind in zip(range(first, last + 1), kinds):
            r = self.records[off]
            if kind == ACK_RENEW and renew_at is not None:
                r.deadline = renew_at + limits.lock_ms
            elif kind == ACK_ACCEPT:
                self._finish(r, ACKNOWLEDGED)
            elif kind == ACK_RELEASE:
                self._release(r, limits)
            else:   # reject, or a gap (no record there): never delivered again
                self._finish(r, ARCHIVED)
        self._advance()
        return KafkaError.NONE

    def skip_to(self, offset: int) -> None:
        """The log no longer holds what lies before `offset` (retention, DeleteRecords):
        the window starts there, whatever was in flight below it is gone."""
        for off in range(self.start, min(offset, self.end)):
            del self.records[off]
        self.start = max(self.start, offset)
        self.end = max(self.end, self.start)
        self._advance()

    # --- counts (describe, metrics) ----------------------------------------------------

    def counts(self) -> dict[str, int]:
        by = {AVAILABLE: 0, ACQUIRED: 0, ACKNOWLEDGED: 0, ARCHIVED: 0}
        for r in self.records.values():
            by[r.state] += 1
        return {"in_flight": self.end - self.start, "available": by[AVAILABLE], "acquired": by[ACQUIRED],
                "acknowledged": by[ACKNOWLEDGED], "archived": by[ARCHIVED]}

    # --- inside -----------------------------------------------------------------------------

    @staticmethod
    def _lock(r: InFlight, member: str, now: int, limits: Limits) -> None:
        r.state, r.member, r.deadline = ACQUIRED, member, now + limits.lock_ms
        r.count += 1

    @staticmethod
    def _finish(r: InFlight, state: int) -> None:
        r.state, r.member, r.deadline = state, None, 0

    def _release(self, r: InFlight, limits: Limits) -> None:
        self._finish(r, ARCHIVED if r.count >= limits.delivery_limit else AVAILABLE)

    def _advance(self) -> None:
        """Move `start` past the finished prefix (those entries are forgotten)."""
        while self.start < self.end and self.records[self.start].state in FINISHED:
            del self.records[self.start]
            self.start += 1

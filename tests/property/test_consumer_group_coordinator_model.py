"""Model-based test of the coordinator's consumer groups (KIP-848) under concurrency:
random interleavings of heartbeats (joins, acknowledgements, leaves) from several
members, fsyncs completing slowly, out of order or failing, appends failing, and
session timeouts firing. After every step:

  - no partition is held by two members, epochs never go down;
  - whenever no write is in flight, memory equals a fresh coordinator's replay of the
    log (fsyncs that failed included: their records are in the log).
"""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "coordinator"))
from test_group_support import FakeClock, GateFlusher, MemLogs, started  # noqa: E402

from semel.coordinator.consumer_group_rules import STATIC_LEAVE_EPOCH, Heartbeat  # noqa: E402

TOPICS = {"t": 4, "u": 2}
MEMBERS = ["a", "b", "c"]


class CoordinatorModel(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.loop = asyncio.new_event_loop()
        self.logs, self.flusher, self.clock = MemLogs(), GateFlusher(), FakeClock()
        self.flusher.hold = True
        self.h = self.loop.run_until_complete(started(self.logs, self.flusher, self.clock,
                                                      consumer_session_timeout_ms=10_000))
        self.tasks: list[tuple[str, asyncio.Task]] = []
        self.known: dict[str, tuple[int, frozenset]] = {}   # member -> (epoch, held) as the client knows
        self.max_epochs: dict[str, int] = {}
        self.max_group_epoch = 0

    def teardown(self):
        self.flusher.hold = False
        for _ in range(5):
            for i in range(len(self.flusher.waiting)):
                self.flusher.release(i)
            self._spin()
        self.loop.run_until_complete(self.h.coord.stop())
        self._spin()
        for _, task in self.tasks:
            task.cancel()
        if self.tasks:
            self.loop.run_until_complete(asyncio.wait([t for _, t in self.tasks]))
        self.loop.close()

    def _spin(self):
        for _ in range(6):
            self.loop.run_until_complete(asyncio.sleep(0))
        done = [(m, t) for m, t in self.tasks if t.done()]
        self.tasks = [(m, t) for m, t in self.tasks if not t.done()]
        for mid, task in done:
            answer = task.result()
            if answer.error:
                continue
            if answer.member_epoch < 0:
                self.known.pop(mid, None)
                continue
            held = answer.assignment if answer.assignment is not None else self.known.get(mid, (0, frozenset()))[1]
            self.known[mid] = (answer.member_epoch, held)

    def _group(self):
        return self.h.coord.store.consumer_groups.get("g")

    def _send(self, mid, hb):
        self.tasks.append((mid, self.loop.create_task(self.h.coord.consumers.consumer_group_heartbeat("g", hb, TOPICS))))
        self._spin()

    @rule(mid=st.sampled_from(MEMBERS), topics=st.sampled_from([("t",), ("u",), ("t", "u")]),
          static=st.booleans())
    def join(self, mid, topics, static):
        self._send(mid, Heartbeat(mid, 0, instance_id=f"i-{mid}" if static else None, topics=topics,
                                  owned=frozenset()))

    @rule(mid=st.sampled_from(MEMBERS))
    def heartbeat(self, mid):
        epoch, held = self.known.get(mid, (1, frozenset()))
        self._send(mid, Heartbeat(mid, epoch, owned=held))

    @rule(mid=st.sampled_from(MEMBERS), static=st.booleans())
    def leave(self, mid, static):
        self._send(mid, Heartbeat(mid, STATIC_LEAVE_EPOCH if static else -1))

    @precondition(lambda self: self.flusher.waiting)
    @rule(data=st.data(), fail=st.booleans())
    def fsync_completes(self, data, fail):
        pending = [i for i, f in enumerate(self.flusher.waiting) if not f.done()]
        if not pending:
            return
        i = data.draw(st.sampled_from(pending))
        self.flusher.fail_next = 1 if fail else 0
        self.flusher.release(i)
        self._spin()
        self.flusher.fail_next = 0

    @rule()
    def append_fails(self):
        self.logs.get("__consumer_offsets", 0).fail_appends = 1
        self.heartbeat("a")
        self.logs.get("__consumer_offsets", 0).fail_appends = 0

    @rule(ms=st.sampled_from([3000, 11_000]))
    def time_passes(self, ms):
        self.clock.advance(ms)

        async def fire():   # on the loop, as the coordinator's timer task fires them
            self.h.coord.fire_timers()
        self.loop.run_until_complete(fire())
        self._spin()

    @invariant()
    def no_partition_twice_and_epochs_grow(self):
        g = self._group()
        if g is None:
            return
        seen = {}
        for mid, cur in g.current.items():
            for tp in cur.assigned | cur.revoking:
                assert tp not in seen, f"{tp} held by {seen[tp]} and {mid}"
                seen[tp] = mid
            if cur.epoch != STATIC_LEAVE_EPOCH and mid in self.max_epochs:
                assert cur.epoch >= self.max_epochs[mid] or cur.epoch == 0
            if cur.epoch != STATIC_LEAVE_EPOCH:
                self.max_epochs[mid] = cur.epoch
        for mid in list(self.max_epochs):
            if mid not in g.current:
                del self.max_epochs[mid]
        assert g.epoch >= self.max_group_epoch
        self.max_group_epoch = g.epoch

    @invariant()
    def memory_is_the_replay_of_the_log(self):
        if self.h.coord.clog.inflight:
            return
        replay = self.loop.run_until_complete(started(self.logs, GateFlusher(), self.clock))
        assert replay.coord.store.consumer_groups == self.h.coord.store.consumer_groups
        self.loop.run_until_complete(replay.coord.stop())


CoordinatorModel.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestCoordinatorModel = CoordinatorModel.TestCase

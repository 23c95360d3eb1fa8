"""Consumer-protocol group membership as a shard, driven directly with no event loop:
Hypothesis picks ConsumerGroupHeartbeat joins, client heartbeats, stale heartbeats,
leaves and static leaves, classic members' JoinGroups (a group with only classic members
left turns classic again), session expiries, overdue revocations and topics that grow.
Each op of semel.coordinator.consumer_shard is appended to an in-memory log as one batch
and replayed into the live store.

After every step:
  - deciding an op changed nothing: only its replay does;
  - the runtime's load of the log into a fresh store (a restart) holds the same groups,
    consumer and classic, as the live store;
  - the group epoch only grows, and no member's epoch passes the assignment epoch;
  - no partition is held (assigned or being revoked) by two members of a group;
  - a member of a Stable group holds its target assignment, at the assignment epoch.
"""
from __future__ import annotations

import copy
import re
import struct
import sys
from collections.abc import Callable
from pathlib import Path

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "coordinator"))
from test_group_support import MemLog  # noqa: E402
from semel.coordinator import consumer_group_rules as R  # noqa: E402
from semel.coordinator.consumer_group_migration import ClassicMember  # noqa: E402
from semel.coordinator.consumer_shard import CgOp, ConsumerShard  # noqa: E402
from semel.coordinator.group_replay import GroupStore  # noqa: E402
from semel.coordinator.runtime import CoordinatorRuntime  # noqa: E402
from semel.protocol import records as rb  # noqa: E402
from semel.protocol.errors import KafkaError  # noqa: E402

GROUP = "g"
NAMES = ["m1", "m2", "m3", "m4"]
CLASSIC = ["c1", "c2"]


def _matches(regex: str, topic: str) -> bool:
    return re.fullmatch(regex, topic) is not None


def subscription(topics: list[str]) -> bytes:
    """ConsumerProtocolSubscription v0, as a classic consumer writes it (no user data)."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def _classic_state(store: GroupStore) -> dict:
    return {g.group_id: (g.generation, g.protocol, sorted(g.members), g.state.name)
            for g in store.groups.values()}


class ConsumerShardModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000
        self.store = GroupStore(lambda: self.now)
        self.shard = ConsumerShard(self.store)
        self.plog = MemLog()
        self.topics: dict[str, int] = {"a": 3, "b": 2}
        # The client side: member id -> (epoch it believes, partitions it holds).
        self.clients: dict[str, tuple[int, frozenset]] = {}
        self.max_group_epoch = 0

    # --- the write path, as the runtime runs it (commit point at once) ----------------------

    def run(self, decide: Callable[[], CgOp]) -> R.Answer:
        before = copy.deepcopy((self.store.consumer_groups, _classic_state(self.store)))
        op = decide()
        pairs = op.pairs()
        assert (self.store.consumer_groups, _classic_state(self.store)) == before, "deciding changed memory"
        if op.response.error:
            assert not pairs, "a refused op writes records"
        if pairs:
            self.now += 1
            data = rb.build_batch(pairs, timestamp_ms=self.now)
            self.plog.append(data, rb.split_batches(data)[0])
            self.shard.replay(op)
        return op.response

    def group(self) -> R.ConsumerGroup | None:
        return self.store.consumer_groups.get(GROUP)

    def _client_heartbeat(self, mid: str) -> R.Answer:
        epoch, owned = self.clients[mid]
        answer = self.run(lambda: self.shard.heartbeat(GROUP, R.Heartbeat(mid, epoch, owned=owned), self.topics, _matches))
        if not answer.error:
            held = answer.assignment if answer.assignment is not None else owned
            self.clients[mid] = (answer.member_epoch, held)
        return answer

    def _forget_gone(self) -> None:
        """Clients whose member the group no longer holds (removed, or the group turned classic)."""
        g = self.group()
        for mid in list(self.clients):
            if g is None or mid not in g.members:
                del self.clients[mid]

    # --- rules ------------------------------------------------------------------------------

    @rule(mid=st.sampled_from(NAMES), topics=st.sets(st.sampled_from(["a", "b"]), min_size=1),
          assignor=st.sampled_from([None, "uniform", "range"]), static=st.booleans())
    def join(self, mid, topics, assignor, static):
        if mid in self.clients:
            return
        hb = R.Heartbeat(mid, 0, instance_id=f"i-{mid}" if static else None, topics=tuple(sorted(topics)),
                         assignor=assignor, owned=frozenset(), rebalance_timeout_ms=1000)
        answer = self.run(lambda: self.shard.heartbeat(GROUP, hb, self.topics, _matches))
        if answer.error == KafkaError.UNRELEASED_INSTANCE_ID:
            return
        assert answer.error == KafkaError.NONE, answer
        assert answer.assignment is not None
        self.clients[mid] = (answer.member_epoch, answer.assignment)

    @precondition(lambda self: self.group() is not None and self.group().members)
    @rule(mid=st.sampled_from(CLASSIC), topics=st.sets(st.sampled_from(["a", "b"]), min_size=1))
    def classic_join(self, mid, topics):
        member = ClassicMember(mid, None, "client", "host", 1000, 10_000,
                               (("range", subscription(sorted(topics))),))
        answer = self.run(lambda: self.shard.classic_join(GROUP, member, self.topics, _matches))
        assert answer.error == KafkaError.NONE, answer

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def heartbeat(self, data):
        mid = data.draw(st.sampled_from(sorted(self.clients)))
        assert self._client_heartbeat(mid).error == KafkaError.NONE

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), delta=st.sampled_from([-3, -1, 1, 5]))
    def wrong_epoch(self, data, delta):
        mid = data.draw(st.sampled_from(sorted(self.clients)))
        cur = self.group().current[mid]
        sent = self.clients[mid][0] + delta
        if sent in (0, -1, -2) or sent in (cur.epoch, cur.previous_epoch):
            return
        answer = self.run(lambda: self.shard.heartbeat(GROUP, R.Heartbeat(mid, sent, owned=frozenset()),
                                               self.topics, _matches))
        assert answer.error == KafkaError.FENCED_MEMBER_EPOCH

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), static=st.booleans())
    def leave(self, data, static):
        mid = data.draw(st.sampled_from(sorted(self.clients)))
        epoch = R.STATIC_LEAVE_EPOCH if static else R.LEAVE_EPOCH
        answer = self.run(lambda: self.shard.heartbeat(GROUP, R.Heartbeat(mid, epoch), self.topics, _matches))
        assert answer.error == KafkaError.NONE
        del self.clients[mid]
        self._forget_gone()

    @precondition(lambda self: self.group() is not None and self.group().members)
    @rule(data=st.data())
    def session_expires(self, data):
        mid = data.draw(st.sampled_from(sorted(self.group().members)))
        self.run(lambda: self.shard.session_expired(GROUP, mid))
        assert self.group() is None or mid not in self.group().members
        self._forget_gone()

    @precondition(lambda self: self.group() is not None and self.group().members)
    @rule(data=st.data())
    def revocation_overdue(self, data):
        g = self.group()
        mid = data.draw(st.sampled_from(sorted(g.members)))
        revoking = g.current[mid].state is R.MemberState.UNREVOKED_PARTITIONS
        self.run(lambda: self.shard.revocation_overdue(GROUP, mid, g.current[mid].epoch))
        assert (self.group() is None or mid not in self.group().members) == revoking
        self._forget_gone()

    @rule(topic=st.sampled_from(["a", "b"]))
    def topic_grows(self, topic):
        self.topics = {**self.topics, topic: self.topics[topic] + 1}

    # --- invariants -------------------------------------------------------------------------

    @invariant()
    def a_restart_loads_the_live_state(self):
        fresh = GroupStore(lambda: self.now)
        CoordinatorRuntime("__consumer_offsets", None).load(fresh, self.plog, None)
        assert fresh.consumer_groups == self.store.consumer_groups
        assert _classic_state(fresh) == _classic_state(self.store)

    @invariant()
    def epochs_only_grow(self):
        g = self.group()
        if g is None:
            self.max_group_epoch = 0   # gone (turned classic): a new group starts over
            return
        assert g.epoch >= self.max_group_epoch
        self.max_group_epoch = g.epoch
        assert g.target_epoch <= g.epoch
        for cur in g.current.values():
            assert cur.epoch == R.STATIC_LEAVE_EPOCH or cur.epoch <= g.target_epoch

    @invariant()
    def no_partition_held_twice(self):
        g = self.group()
        owner: dict = {}
        for mid, cur in (g.current.items() if g is not None else ()):
            for tp in cur.assigned | cur.revoking:
                assert tp not in owner, f"{tp} held by {owner[tp]} and {mid}"
                owner[tp] = mid

    @invariant()
    def a_stable_group_s_members_hold_their_target(self):
        g = self.group()
        if g is None or g.state_name() != "Stable":
            return
        for mid, cur in g.current.items():
            if cur.epoch != R.STATIC_LEAVE_EPOCH:
                assert cur.epoch == g.target_epoch and cur.assigned == g.target.get(mid, frozenset()), (mid, cur)


ConsumerShardModel.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
test_consumer_shard_model = ConsumerShardModel.TestCase

"""Model-based test of online migration (consumer_group_migration): a classic group of
two members is upgraded; then random steps: members of the consumer protocol join,
heartbeat and leave; classic members heartbeat, rejoin eagerly (giving everything up)
or cooperatively (reporting what they still own), join anew and leave; the group may
be downgraded when the last consumer-protocol member leaves.

After every step:
  - what the clients hold is disjoint (no partition used by two members at once), and
    each client holds only partitions the coordinator records it as holding;
  - the coordinator's own record holds no partition twice (assigned or revoking);
  - the records of each transition, replayed from the start, give the group in memory.
"""
from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from semel.coordinator import consumer_group_migration as mig
from semel.coordinator import consumer_group_rules as R
from semel.coordinator.consumer_records import apply_record, records_between
from semel.coordinator.offsets import decode_key
from semel.protocol.consumer_protocol import decode_assignment, encode_assignment
from semel.protocol.errors import KafkaError

TOPICS = {"t": 6}
CONSUMERS = ["c1", "c2"]
CLASSICS = ["k1", "k2", "k3"]


def _matches(regex: str, topic: str) -> bool:
    return False


def sub(owned=()) -> bytes:
    import struct
    out = struct.pack(">hi", 1, 1) + struct.pack(">h", 1) + b"t" + struct.pack(">i", -1)
    owned = sorted(owned)
    out += struct.pack(">i", 1 if owned else 0)
    if owned:
        out += struct.pack(">h", 1) + b"t" + struct.pack(">i", len(owned))
        out += b"".join(struct.pack(">i", p) for _, p in owned)
    return out


def classic(mid: str, owned=(), assignment=b"") -> mig.ClassicMember:
    return mig.ClassicMember(mid, None, "kp", "/h", 30_000, 10_000, (("range", sub(owned)),), assignment)


class MigrationModel(RuleBasedStateMachine):
    @initialize()
    def start(self):
        members = [classic("k1", assignment=encode_assignment([("t", 0), ("t", 1), ("t", 2)])),
                   classic("k2", assignment=encode_assignment([("t", 3), ("t", 4), ("t", 5)]))]
        self.group: R.ConsumerGroup | None = mig.from_classic("g", 3, members)
        self.replayed: dict[str, R.ConsumerGroup] = {}
        for key, value in records_between(None, self.group):
            apply_record(self.replayed, decode_key(key), value)
        # member id -> (epoch it believes, partitions it holds)
        self.clients: dict[str, tuple[int, frozenset]] = {
            m.member_id: (3, decode_assignment(m.assignment)) for m in members}
        self.downgraded = False
        self.received: dict[str, frozenset] = {}   # a classic member's last SyncGroup assignment

    def _apply(self, new: R.ConsumerGroup | None) -> None:
        if new is not self.group:
            for key, value in records_between(self.group, new):
                apply_record(self.replayed, decode_key(key), value)
            self.group = new

    def _remove(self, mid: str) -> None:
        new = R.remove_member(self.group, mid)
        self.clients.pop(mid, None)
        self.received.pop(mid, None)
        if mig.downgrades(new, mig.MigrationPolicy.BIDIRECTIONAL) and mid in CONSUMERS:
            # Classic again (from here the classic protocol's clients keep their partitions
            # apart): the snapshot gives each member what its last SyncGroup gave it.
            for m in mig.to_classic(new):
                cur = new.current[m.member_id]
                assert decode_assignment(m.assignment) == cur.assigned
                assert self.clients[m.member_id][1] <= cur.assigned | cur.revoking
            self._apply(None)
            self.downgraded = True
            return
        self._apply(new)

    # --- members of the consumer protocol ------------------------------------------------

    @precondition(lambda self: not self.downgraded)
    @rule(mid=st.sampled_from(CONSUMERS))
    def consumer_heartbeat(self, mid):
        epoch, held = self.clients.get(mid, (0, frozenset()))
        hb = R.Heartbeat(mid, epoch, topics=("t",) if epoch == 0 else None, owned=held)
        new, answer = R.heartbeat(self.group, "g", hb, TOPICS, _matches)
        assert not answer.error, answer
        self._apply(new)
        self.clients[mid] = (answer.member_epoch, answer.assignment if answer.assignment is not None else held)

    @precondition(lambda self: not self.downgraded and any(c in self.clients for c in CONSUMERS))
    @rule(mid=st.sampled_from(CONSUMERS))
    def consumer_leaves(self, mid):
        if mid in self.clients:
            self._remove(mid)

    # --- classic members ----------------------------------------------------------------

    @precondition(lambda self: not self.downgraded)
    @rule(mid=st.sampled_from(CLASSICS), eager=st.booleans())
    def classic_joins(self, mid, eager):
        _, held = self.clients.get(mid, (0, frozenset()))
        if eager:   # an eager member gives everything up before it rejoins
            held = frozenset()
            if mid in self.clients:
                self.clients[mid] = (self.clients[mid][0], held)
        new, answer = mig.classic_join(self.group, classic(mid, owned=held), TOPICS, _matches)
        assert not answer.error, answer
        self._apply(new)
        err, cur = mig.classic_sync(self.group, mid, answer.member_epoch)
        assert err == KafkaError.NONE
        # A cooperative member keeps using what it held until it has revoked what its new
        # assignment leaves out (classic_revokes); an eager one held nothing.
        self.clients[mid] = (answer.member_epoch, held | cur.assigned)
        self.received[mid] = cur.assigned

    @precondition(lambda self: not self.downgraded)
    @rule(mid=st.sampled_from(CLASSICS))
    def classic_revokes(self, mid):
        if mid in self.clients and mid in self.received:
            self.clients[mid] = (self.clients[mid][0], self.received[mid])

    @precondition(lambda self: not self.downgraded)
    @rule(mid=st.sampled_from(CLASSICS))
    def classic_heartbeat(self, mid):
        if mid not in self.clients:
            return
        err = mig.classic_heartbeat(self.group, mid, self.clients[mid][0])
        assert err in (KafkaError.NONE, KafkaError.REBALANCE_IN_PROGRESS), err

    @precondition(lambda self: not self.downgraded)
    @rule(mid=st.sampled_from(CLASSICS))
    def classic_leaves(self, mid):
        if mid in self.clients and len(self.group.members) > 1:
            self._remove(mid)

    @precondition(lambda self: self.downgraded)
    @rule()
    def classic_again(self):
        assert self.group is None and all(m in CLASSICS for m in self.clients)

    # --- invariants ---------------------------------------------------------------------

    @invariant()
    def no_partition_held_twice(self):
        seen: dict = {}
        for mid, (_, held) in self.clients.items():
            for tp in held:
                assert tp not in seen, f"{tp} held by {seen[tp]} and {mid}"
                seen[tp] = mid
        if self.group is None:
            return
        owned: dict = {}
        for mid, cur in self.group.current.items():
            for tp in cur.assigned | cur.revoking:
                assert tp not in owned, f"{tp} recorded for {owned[tp]} and {mid}"
                owned[tp] = mid
        for mid, (_, held) in self.clients.items():
            cur = self.group.current[mid]
            assert held <= cur.assigned | cur.revoking, (mid, held, cur)

    @invariant()
    def memory_is_the_replay(self):
        if self.group is None:
            assert "g" not in self.replayed
            return
        r = self.replayed["g"]
        g = self.group
        assert (r.epoch, r.target_epoch, r.members, r.target, r.current) == (
            g.epoch, g.target_epoch, g.members, g.target, g.current)


MigrationModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_migration_model = MigrationModel.TestCase

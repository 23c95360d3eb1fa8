"""Classic group membership as a shard, driven directly with no event loop: Hypothesis
picks JoinGroups (dynamic members with and without KIP-394's member id round trip, static
members that replace their earlier instance), SyncGroups (the leader's with an
assignment), Heartbeats, LeaveGroups, clients that go away mid-poll, time passing (the
deadlines fire in order: sessions, the initial delay, the join and sync deadlines) and the
group snapshots' writes becoming durable or failing; static instances restarting in a
Stable group; and, between the disorderly steps, rebalances that run their course (so
groups reach Stable with several members). The test is the edge: it replays
each op of semel.coordinator.classic_shard, keeps the long polls, the deadlines and the
log.

After every step:
  - deciding an op changed nothing: only its replay does;
  - a member waits in JoinGroup or SyncGroup exactly when the shard says so, and every
    answer goes to a poll that waits;
  - the generation never goes back; the leader is a member; members pending sync are
    members; the static instances map to their members one to one; no JoinGroup waits
    once the join phase is over, no SyncGroup outside the sync phase; while the group
    stores the leader's assignment, its write is in flight;
  - every successful JoinGroup answer of one generation names the same leader and
    protocol;
  - a successful SyncGroup answer and every member of a Stable group carry the assignment
    the leader sent for the current generation, and only once its write is durable;
  - with no write in flight and none lost, a restart (the runtime's load of the log into a
    fresh store) finds a Stable or stored Empty group as memory holds it: generation,
    protocol, leader, members and assignments.
"""
from __future__ import annotations

import copy
import itertools
import sys
from pathlib import Path

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "coordinator"))
from test_group_support import MemLog  # noqa: E402
from semel.coordinator.classic_ops import ClassicOp, Write  # noqa: E402
from semel.coordinator.classic_shard import ClassicShard  # noqa: E402
from semel.coordinator.group_model import JOIN, SYNC, Group, GroupConfig, JoinRequest, JoinResult, SyncResult  # noqa: E402
from semel.coordinator.group_replay import GroupStore  # noqa: E402
from semel.coordinator.group_states import GroupState  # noqa: E402
from semel.coordinator.offsets import group_key, group_value  # noqa: E402
from semel.coordinator.runtime import CoordinatorRuntime  # noqa: E402
from semel.protocol import records as rb  # noqa: E402
from semel.protocol.errors import KafkaError  # noqa: E402

GROUP = "g"
CLIENTS = ["d0", "d1", "s2", "s3"]          # d: dynamic members, s: static (instance "i-s2", "i-s3")
PROTOCOLS = {"range": [("range", b"r")], "both": [("range", b"r"), ("sticky", b"s")],
             "sticky": [("sticky", b"s")]}
S = GroupState


def fingerprint(store: GroupStore) -> dict:
    """Everything a classic operation may change, by group."""
    out = {}
    for gid, g in store.groups.items():
        members = tuple((m.member_id, m.group_instance_id, tuple(m.protocols), m.assignment, m.awaiting_join,
                         m.awaiting_sync, m.is_new, m.session_timeout_ms, m.rebalance_timeout_ms)
                        for m in g.members.values())
        out[gid] = (g.state, g.generation, g.protocol_type, g.protocol, g.leader, members,
                    frozenset(g.pending_members), tuple(sorted(g.static.items())), frozenset(g.pending_sync),
                    g.new_member_added, g.initial_delay, g.storing_generation, g.persisted)
    return out


class Client:
    def __init__(self, name: str) -> None:
        self.instance = f"i-{name}" if name.startswith("s") else None
        self.member_id = ""
        self.generation = -1
        self.members: list[str] = []     # the members its last JoinGroup answer named (leader only)


class ClassicShardModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000
        ids = itertools.count()
        self.store = GroupStore(lambda: self.now)
        self.shard = ClassicShard(self.store, GroupConfig(), lambda: self.now,
                                  new_id=lambda prefix: f"{prefix}-{next(ids)}")
        self.plog = MemLog()
        self.clients = {name: Client(name) for name in CLIENTS}
        self.waiting: set[tuple[str, str]] = set()        # (kind, member id) polls that wait
        self.timers: dict[tuple, tuple[int, int, object]] = {}   # key -> (deadline, seq, due)
        self.seq = itertools.count()
        self.inflight: list[Write] = []                     # writes not yet durable, in log order
        # generation -> {member (its instance id when static): assignment}, as durable
        self.durable_assignments: dict[int, dict[str, bytes]] = {}
        self.leaders: dict[int, tuple[str, str | None]] = {}          # generation -> (leader, protocol)
        self.lost_snapshot = False
        self.max_generation = 0

    # --- the edge --------------------------------------------------------------------------------

    def run(self, decide, member_id: str | None = None) -> object:
        """Decide, check that deciding changed nothing, then carry the op out as the edge
        does. `member_id`: whose request it answers."""
        before = copy.deepcopy(fingerprint(self.store))
        op: ClassicOp = decide()
        assert fingerprint(self.store) == before, "deciding changed memory"
        self.shard.replay(op)
        for kind, member_id, result in op.polls:
            if result is None:
                self.waiting.add((kind, member_id))
            else:
                assert (kind, member_id) in self.waiting, f"an answer to a poll that does not wait: {kind} {member_id}"
                self.waiting.discard((kind, member_id))
                self.heard(member_id, result)
        for t in op.timers:
            if t.due is None:
                self.timers.pop(t.key, None)
            else:
                self.timers[t.key] = (self.now + t.delay_ms, next(self.seq), t.due)
        self.inflight += op.writes
        if isinstance(op.response, (JoinResult, SyncResult)):
            self.heard(member_id, op.response)
        return op.response

    def heard(self, member_id: str | None, result: JoinResult | SyncResult) -> None:
        """A client got `result`; check it and let the client learn from it."""
        g = self.store.groups.get(GROUP)
        if isinstance(result, JoinResult):
            if result.error is KafkaError.NONE:
                leader = self.leaders.setdefault(result.generation, (result.leader, result.protocol_name))
                assert leader == (result.leader, result.protocol_name), "two leaders or protocols in a generation"
            client = self.client_of(result.member_id or member_id or "")
            if client is not None and client.member_id == result.member_id and result.error in (
                    KafkaError.UNKNOWN_MEMBER_ID, KafkaError.FENCED_INSTANCE_ID):
                client.member_id = ""   # as a client does: it joins afresh
            if client is not None and result.error in (KafkaError.NONE, KafkaError.MEMBER_ID_REQUIRED):
                client.member_id = result.member_id
                client.generation = result.generation
                client.members = [mid for mid, _inst, _meta in result.members]
            return
        if result.error is KafkaError.NONE:
            assert g is not None and member_id in g.members
            assert g.generation in self.durable_assignments, "an assignment answered before it is durable"
            assert result.assignment == self.durable(g, member_id)

    def durable(self, g, member_id: str) -> bytes:
        """The durable assignment of the group's member at the current generation (a static
        member's follows its instance id to the member that replaced it)."""
        m = g.members[member_id]
        return self.durable_assignments[g.generation].get(m.group_instance_id or member_id, b"")

    def client_of(self, member_id: str) -> Client | None:
        """The client a member id was made for (ids start with the instance or client id)."""
        for name, c in self.clients.items():
            if member_id.startswith(f"{c.instance or name}-"):
                return c
        return None

    def group(self):
        return self.store.groups.get(GROUP)

    # --- requests ----------------------------------------------------------------------------------

    @rule(name=st.sampled_from(CLIENTS), protocols=st.sampled_from(["both", "both", "range", "sticky"]),
          known=st.booleans(), fresh=st.sampled_from([False, False, True]), rebalance=st.sampled_from([3_000, 8_000]))
    def join(self, name, protocols, known, fresh, rebalance):
        c = self.clients[name]
        member_id = "" if fresh else c.member_id
        req = JoinRequest(c.instance, name, "/127.0.0.1", 10_000, rebalance, "consumer",
                          list(PROTOCOLS[protocols]))
        self.run(lambda: self.shard.join(GROUP, member_id, req, known))

    def known(self) -> list[str]:
        return [name for name, c in self.clients.items() if c.member_id]

    def sync(self, name):
        c = self.clients[name]
        assignments = {mid: f"{mid}@{c.generation}".encode() for mid in c.members}
        self.run(lambda: self.shard.sync(GROUP, c.generation, c.member_id, group_instance_id=c.instance,
                                         assignments=assignments), c.member_id)

    @precondition(lambda self: self.in_step())
    @rule(data=st.data())
    def sync_as_told(self, data):
        """A client whose JoinGroup answer is of the current generation syncs (so groups
        get to Stable often, beside the syncs at random above)."""
        self.sync(data.draw(st.sampled_from(self.in_step())))

    @precondition(lambda self: self.told_to_rejoin())
    @rule(data=st.data())
    def rejoin_as_told(self, data):
        """A member the rebalance waits for joins again (its heartbeat would say so), or one
        given its member id joins with it."""
        name = data.draw(st.sampled_from(self.told_to_rejoin()))
        self.join(name, "both", True, False, 8_000)

    @precondition(lambda self: self.group() is not None)
    @rule()
    def a_rebalance_runs_its_course(self):
        """Every client does as the protocol tells it for a while: those the join phase
        waits for join, the initial delay passes, those with the current generation sync
        (the leader first), the writes become durable. Groups reach Stable with several
        members this way, between the disorderly steps."""
        for _ in range(4):
            for name in self.told_to_rejoin():
                self.join(name, "both", True, False, 8_000)
            self.time_passes(300)
            g = self.group()
            if g is None:
                return
            for name in sorted(self.in_step(), key=lambda n: self.clients[n].member_id != g.leader):
                self.sync(name)
            while self.inflight:
                self.write_durable()

    @precondition(lambda self: self.static_followers())
    @rule(data=st.data())
    def static_instance_restarts(self, data):
        """A static member's process restarts (KIP-345): it joins with no member id and
        what it sent before, and replaces its old member without a rebalance."""
        name = data.draw(st.sampled_from(self.static_followers()))
        c = self.clients[name]
        old = self.group().members[c.member_id]
        req = JoinRequest(c.instance, name, "/127.0.0.1", 10_000, old.rebalance_timeout_ms, "consumer",
                          list(old.protocols))
        self.run(lambda: self.shard.join(GROUP, "", req, True))

    def static_followers(self) -> list[str]:
        g = self.group()
        if g is None or g.state is not S.STABLE:
            return []
        return [name for name, c in self.clients.items()
                if c.instance and c.member_id in g.members and c.member_id != g.leader]

    def told_to_rejoin(self) -> list[str]:
        g = self.group()
        if g is None or g.state is not S.PREPARING_REBALANCE:
            return []
        return [name for name, c in self.clients.items()
                if c.member_id in g.pending_members
                or (c.member_id in g.members and not g.members[c.member_id].awaiting_join)]

    def in_step(self) -> list[str]:
        g = self.group()
        return [name for name, c in self.clients.items()
                if g is not None and c.member_id in g.members and c.generation == g.generation]

    @precondition(lambda self: self.known())
    @rule(data=st.data(), request=st.sampled_from(["sync", "heartbeat"]))
    def a_client_with_a_member_id_asks(self, data, request):
        """SyncGroup or Heartbeat at any time, with whatever generation it knows."""
        getattr(self, request)(data.draw(st.sampled_from(self.known())))

    def heartbeat(self, name):
        c = self.clients[name]
        self.run(lambda: self.shard.heartbeat(GROUP, c.generation, c.member_id, c.instance))

    @precondition(lambda self: self.known())
    @rule(data=st.data(), by_instance=st.booleans())
    def leave(self, data, by_instance):
        c = self.clients[data.draw(st.sampled_from(self.known()))]
        inst = c.instance if by_instance else None
        self.run(lambda: self.shard.leave(GROUP, [(c.member_id, inst)]))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def client_goes_away(self, data):
        kind, member_id = data.draw(st.sampled_from(sorted(self.waiting)))
        self.waiting.discard((kind, member_id))
        self.run(lambda: self.shard.abandoned(GROUP, member_id, kind))

    # --- time and the log ----------------------------------------------------------------------

    @rule()
    def everyone_heartbeats(self):
        """The clients' background heartbeats, all in one step."""
        for name in CLIENTS:
            if self.clients[name].member_id:
                self.heartbeat(name)

    @rule(ms=st.sampled_from([100, 300, 1_000, 3_000, 11_000]))
    def time_passes(self, ms):
        self.now += ms
        while True:
            due = sorted((d, s, k) for k, (d, s, _) in self.timers.items() if d <= self.now)
            if not due:
                return
            key = due[0][2]
            _, _, what = self.timers.pop(key)
            self.run(lambda: self.shard.due(key[1], what))

    @precondition(lambda self: self.inflight)
    @rule()
    def write_durable(self):
        write = self.inflight.pop(0)
        pairs = [(group_key(GROUP), group_value(write.snapshot))]
        data = rb.build_batch(pairs, timestamp_ms=self.now)
        self.plog.append(data, rb.split_batches(data)[0])
        self.durable_assignments[write.snapshot.generation] = {
            m.group_instance_id or m.member_id: m.assignment for m in write.snapshot.members}
        self.run(lambda: self.shard.stored(GROUP, write))

    @precondition(lambda self: self.inflight)
    @rule()
    def write_fails(self):
        write = self.inflight.pop(0)
        self.lost_snapshot = True
        self.run(lambda: self.shard.store_failed(GROUP, write, KafkaError.COORDINATOR_NOT_AVAILABLE))

    # --- invariants ----------------------------------------------------------------------------------

    @invariant()
    def polls_wait_exactly_where_the_shard_says(self):
        g = self.group()
        flagged = set()
        for m in (g.members.values() if g is not None else ()):
            if m.awaiting_join:
                flagged.add((JOIN, m.member_id))
            if m.awaiting_sync:
                flagged.add((SYNC, m.member_id))
        assert flagged == self.waiting

    @invariant()
    def the_group_holds_together(self):
        g = self.group()
        if g is None:
            # Forgotten (it held nothing): a new group of the same id starts over.
            self.max_generation = 0
            self.leaders.clear()
            # A snapshot of the forgotten group may still land: the log then holds a
            # record a new group of the id does not match.
            self.lost_snapshot = self.lost_snapshot or bool(self.inflight)
            return
        assert g.generation >= self.max_generation, "the generation went back"
        self.max_generation = g.generation
        if g.members:
            assert g.leader in g.members
        assert g.pending_sync <= set(g.members)
        if g.state in (S.COMPLETING_REBALANCE, S.STABLE):
            assert not any(m.awaiting_join for m in g.members.values()), "a JoinGroup left waiting after the join phase"
        else:
            assert not any(m.awaiting_sync for m in g.members.values()), "a SyncGroup waiting outside its phase"
        assert {m.group_instance_id: mid for mid, m in g.members.items() if m.group_instance_id} == g.static
        if g.state is S.COMPLETING_REBALANCE and g.storing_generation == g.generation:
            assert any(w.generation == g.generation for w in self.inflight), \
                "members wait for an assignment no write will bring"
        if g.state is S.STABLE:
            assert g.generation in self.durable_assignments, "Stable before the assignment is durable"
            for mid, m in g.members.items():
                assert m.assignment == self.durable(g, mid)

    @invariant()
    def a_restart_finds_the_group_as_memory_holds_it(self):
        g = self.group()
        if g is None or self.inflight or self.lost_snapshot or not g.persisted:
            return
        if g.state not in (S.STABLE, S.EMPTY) or g.pending_members:
            return
        fresh = GroupStore(lambda: self.now)
        CoordinatorRuntime("__consumer_offsets", None).load(fresh, self.plog, None)
        f = fresh.groups[GROUP]
        assert (f.generation, f.protocol, f.leader, f.state) == (g.generation, g.protocol, g.leader, g.state)
        assert {mid: m.assignment for mid, m in f.members.items()} == {mid: m.assignment for mid, m in g.members.items()}


ClassicShardModel.TestCase.settings = settings(max_examples=600, stateful_step_count=60, deadline=None)
test_classic_shard_model = ClassicShardModel.TestCase


def test_an_op_carries_every_field_of_a_group_but_its_id_and_offsets():
    """`replay` hands the live group the fields `Group.MEMBERSHIP` names: a field added to
    Group and left out there would change in a decided copy and never reach memory."""
    g = Group(GROUP, 0)
    assert set(vars(g)) == {*Group.MEMBERSHIP, "group_id", "offsets"}
    copy_ = g.membership_copy()
    assert copy_.offsets is g.offsets and copy_.members is not g.members

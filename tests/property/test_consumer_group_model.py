"""Model-based test of the consumer group rules (KIP-848): random joins, heartbeats
(current, stale and from the future), leaves, static leaves and returns, session
fencing and topics that appear or grow, against the pure rules.

After every step:
  - no partition is held by two members (assigned or being revoked);
  - the group epoch and each member's epoch never go down (the static-leave marker
    -2 aside), and a member's epoch never passes the assignment epoch, nor that the
    group epoch;
  - a member at the assignment epoch holds only partitions its target gives it;
  - the records logged for each transition, applied from the start, give exactly the
    group in memory (memory == replay of the log).
When the group is left alone and its members heartbeat as a client does, every
partition of every subscribed topic ends up held, each member at the target.
"""
from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from semel.coordinator import consumer_group_rules as R
from semel.coordinator.consumer_records import apply_record, records_between
from semel.coordinator.offsets import decode_key
from semel.protocol.errors import KafkaError

GROUP = "g"
NAMES = ["m1", "m2", "m3", "m4"]
TOPIC_POOL = ["a", "b", "c", "re-x"]


def _matches(regex: str, topic: str) -> bool:
    import re
    return re.fullmatch(regex, topic) is not None


class ConsumerGroupModel(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.group: R.ConsumerGroup | None = None
        self.replayed: dict[str, R.ConsumerGroup] = {}
        self.topics: dict[str, int] = {"a": 3, "b": 2}
        # The client side: member id -> (epoch it believes, partitions it holds)
        self.clients: dict[str, tuple[int, frozenset]] = {}
        self.max_group_epoch = 0
        self.max_member_epoch: dict[str, int] = {}

    # --- driving ------------------------------------------------------------------------

    def _apply(self, new, answer):
        if new is not self.group:
            for key, value in records_between(self.group, new):
                apply_record(self.replayed, decode_key(key), value)
            self.group = new
        return answer

    def _heartbeat(self, hb: R.Heartbeat) -> R.Answer:
        new, answer = R.heartbeat(self.group, GROUP, hb, self.topics, _matches)
        if answer.error:
            assert new is self.group, "a refused heartbeat changed the group"
        return self._apply(new, answer)

    def _client_heartbeat(self, mid: str) -> R.Answer:
        epoch, owned = self.clients[mid]
        answer = self._heartbeat(R.Heartbeat(mid, epoch, owned=owned))
        if answer.error:
            return answer
        held = answer.assignment if answer.assignment is not None else owned
        self.clients[mid] = (answer.member_epoch, held)
        return answer

    @rule(mid=st.sampled_from(NAMES), topics=st.sets(st.sampled_from(TOPIC_POOL[:3]), max_size=3),
          regex=st.sampled_from([None, None, "re-.*"]), assignor=st.sampled_from([None, "uniform", "range"]),
          static=st.booleans())
    def join(self, mid, topics, regex, assignor, static):
        if mid in self.clients:
            return
        hb = R.Heartbeat(mid, 0, instance_id=f"i-{mid}" if static else None, topics=tuple(sorted(topics)),
                         regex=regex, assignor=assignor, owned=frozenset(), rebalance_timeout_ms=1000)
        answer = self._heartbeat(hb)
        if answer.error == KafkaError.UNRELEASED_INSTANCE_ID:
            # Only while another member that has not left holds the instance id.
            holders = [m for m, meta in self.group.members.items() if meta.instance_id == hb.instance_id]
            assert holders and self.group.current[holders[0]].epoch != R.STATIC_LEAVE_EPOCH
            return
        assert answer.error == KafkaError.NONE, answer
        assert answer.assignment is not None   # a joining member always gets its assignment
        self.clients[mid] = (answer.member_epoch, answer.assignment)

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def heartbeat(self, data):
        mid = data.draw(st.sampled_from(sorted(self.clients)))
        answer = self._client_heartbeat(mid)
        assert answer.error == KafkaError.NONE, answer

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), delta=st.sampled_from([-3, -1, 1, 5]))
    def wrong_epoch(self, data, delta):
        mid = data.draw(st.sampled_from(sorted(self.clients)))
        epoch, _ = self.clients[mid]
        cur = self.group.current[mid]
        sent = epoch + delta
        if sent in (0, -1, -2) or sent == cur.epoch or sent == cur.previous_epoch:
            return
        answer = self._heartbeat(R.Heartbeat(mid, sent, owned=frozenset()))
        assert answer.error == KafkaError.FENCED_MEMBER_EPOCH

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def leave(self, data):
        mid = data.draw(st.sampled_from(sorted(self.clients)))
        answer = self._heartbeat(R.Heartbeat(mid, R.LEAVE_EPOCH))
        assert answer.error == KafkaError.NONE and answer.member_epoch == R.LEAVE_EPOCH
        del self.clients[mid]
        self.max_member_epoch.pop(mid, None)
        assert mid not in self.group.members

    @precondition(lambda self: any(self.group.members[m].instance_id for m in self.clients))
    @rule(data=st.data(), come_back=st.booleans())
    def static_leave(self, data, come_back):
        mid = data.draw(st.sampled_from(sorted(m for m in self.clients if self.group.members[m].instance_id)))
        instance = self.group.members[mid].instance_id
        held = self.group.current[mid].assigned
        answer = self._heartbeat(R.Heartbeat(mid, R.STATIC_LEAVE_EPOCH))
        assert answer.member_epoch == R.STATIC_LEAVE_EPOCH
        del self.clients[mid]
        if not come_back:
            return
        new_id = mid + "'"
        if new_id in self.group.members:
            return
        answer = self._heartbeat(R.Heartbeat(new_id, 0, instance_id=instance, topics=None, regex=None,
                                             owned=frozenset()))
        if answer.error == KafkaError.INVALID_REQUEST:   # a rejoin names its subscription again
            answer = self._heartbeat(R.Heartbeat(new_id, 0, instance_id=instance,
                                                 topics=self.group.members[mid].topics, owned=frozenset()))
        assert answer.error == KafkaError.NONE, answer
        # It is back with the partitions it had, without a new group epoch.
        assert self.group.current[new_id].assigned >= held & self.group.target.get(new_id, held)
        self.max_member_epoch[new_id] = self.max_member_epoch.pop(mid, 0)
        self.clients[new_id] = (answer.member_epoch, answer.assignment)

    @precondition(lambda self: self.group is not None and self.group.members)
    @rule(data=st.data())
    def session_expires(self, data):
        mid = data.draw(st.sampled_from(sorted(self.group.members)))
        self._apply(R.remove_member(self.group, mid), None)
        self.clients.pop(mid, None)
        self.max_member_epoch.pop(mid, None)

    @rule(topic=st.sampled_from(TOPIC_POOL), grow=st.integers(1, 2))
    def topic_changes(self, topic, grow):
        self.topics = {**self.topics, topic: self.topics.get(topic, 0) + grow}

    @precondition(lambda self: self.clients)
    @rule()
    def settle(self):
        """Alone, with every member heartbeating as a client does, the group converges
        (static members that left and did not come back lose their session first)."""
        for mid, cur in list(self.group.current.items()):
            if cur.epoch == R.STATIC_LEAVE_EPOCH:
                self._apply(R.remove_member(self.group, mid), None)
        for _ in range(4 * (len(self.clients) + 2)):
            for mid in sorted(self.clients):
                assert self._client_heartbeat(mid).error == KafkaError.NONE
            self.group_invariants()
        g = self.group
        assert g.target_epoch == g.epoch
        for mid in self.clients:
            cur = g.current[mid]
            assert (cur.state, cur.epoch) == (R.MemberState.STABLE, g.target_epoch), (mid, cur)
            assert cur.assigned == g.target.get(mid, frozenset()) == self.clients[mid][1]
        subscribed = set()
        for m in g.members:
            subscribed |= R.subscribed_topics(g.members[m], self.topics, _matches)
        wanted = {(t, p) for t in subscribed for p in range(self.topics.get(t, 0))}
        held = set().union(*(g.current[m].assigned for m in g.members))
        assert held == wanted

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def group_invariants(self):
        g = self.group
        if g is None:
            return
        owner: dict = {}
        for mid, cur in g.current.items():
            for tp in cur.assigned | cur.revoking:
                assert tp not in owner, f"{tp} held by {owner[tp]} and {mid}"
                owner[tp] = mid
        assert g.epoch >= self.max_group_epoch
        self.max_group_epoch = g.epoch
        assert g.target_epoch <= g.epoch
        for mid, cur in g.current.items():
            if cur.epoch == R.STATIC_LEAVE_EPOCH:
                continue
            assert cur.epoch <= g.target_epoch
            assert cur.epoch >= self.max_member_epoch.get(mid, 0), (mid, cur.epoch)
            self.max_member_epoch[mid] = cur.epoch
            if cur.epoch == g.target_epoch:
                assert cur.assigned <= g.target.get(mid, frozenset())
        assert set(g.members) == set(g.current)
        assert self.replayed.get(GROUP) == g, "memory differs from the replay of the records"


ConsumerGroupModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestConsumerGroupModel = ConsumerGroupModel.TestCase


def test_uniform_spreads_evenly_and_range_gives_ranges():
    from semel.coordinator.consumer_assignors import range_, uniform
    subs = {"x": frozenset({"t"}), "y": frozenset({"t"})}
    got = uniform(subs, {"t": 4}, {})
    assert sorted(len(v) for v in got.values()) == [2, 2]
    assert got["x"] | got["y"] == {("t", p) for p in range(4)}
    # Sticky: a third member takes one partition; the others keep what they can.
    got3 = uniform({**subs, "z": frozenset({"t"})}, {"t": 4}, got)
    assert sorted(len(v) for v in got3.values()) == [1, 1, 2]
    assert len(got3["x"] & got["x"]) + len(got3["y"] & got["y"]) == 3
    assert range_(subs, {"t": 5}, {}) == {"x": frozenset({("t", 0), ("t", 1), ("t", 2)}),
                                          "y": frozenset({("t", 3), ("t", 4)})}


def test_partition_moves_only_after_the_previous_owner_released_it():
    topics = {"t": 2}
    g, a = R.heartbeat(None, GROUP, R.Heartbeat("x", 0, topics=("t",), owned=frozenset()), topics, _matches)
    assert a.assignment == {("t", 0), ("t", 1)}
    g, b = R.heartbeat(g, GROUP, R.Heartbeat("y", 0, topics=("t",), owned=frozenset()), topics, _matches)
    assert b.assignment == frozenset()          # its partition is still x's
    g, a2 = R.heartbeat(g, GROUP, R.Heartbeat("x", a.member_epoch, owned=a.assignment), topics, _matches)
    assert g.current["x"].state is R.MemberState.UNREVOKED_PARTITIONS
    assert len(a2.assignment) == 1 and a2.member_epoch == a.member_epoch
    g, b2 = R.heartbeat(g, GROUP, R.Heartbeat("y", b.member_epoch, owned=frozenset()), topics, _matches)
    assert not b2.assignment                    # x has not said it gave it up
    g, a3 = R.heartbeat(g, GROUP, R.Heartbeat("x", a2.member_epoch, owned=a2.assignment), topics, _matches)
    assert a3.member_epoch > a.member_epoch
    g, b3 = R.heartbeat(g, GROUP, R.Heartbeat("y", b2.member_epoch, owned=frozenset()), topics, _matches)
    assert b3.assignment == {("t", 0), ("t", 1)} - a2.assignment

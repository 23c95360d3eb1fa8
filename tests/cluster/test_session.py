"""A broker's own judgement of its etcd session (semel.cluster.session), the view's
fencing and resumption on it, the leader hand-over rule, and the outage log."""
from __future__ import annotations

import asyncio
import logging
import random

import pytest

from semel.cluster.etcd import EtcdError
from semel.cluster.metadata import EtcdClusterView
from semel.cluster.replica_rules import hand_over
from semel.cluster.session import LeaseClock, OutageLog
from semel.cluster.state import NO_LEADER, BrokerInfo, PartitionState
from tests.support.fake_etcd import FakeEtcd


# -- LeaseClock against a model of etcd's lease ------------------------------------------

@pytest.mark.parametrize("seed", range(300))
def test_broker_never_thinks_itself_registered_after_etcd_expired_it(seed):
    """Keepalives leave every period; each reaches etcd after a random delay or is lost,
    and its answer comes back after another or is lost. etcd renews on receipt while the
    lease lives (an expired lease stays expired). At every instant of the run, if etcd
    holds the lease expired, the broker must take itself as lapsed."""
    rng = random.Random(seed)
    ttl, period = 3.0, 1.0
    now = [0.0]
    clock = LeaseClock(lambda: now[0])
    clock.renewed(0.0, ttl)
    etcd_expiry = ttl             # granted at 0, received at 0 at the latest
    events = []                   # (time, kind, sent_at)
    t = 0.0
    while t < 60:
        t += period
        if rng.random() < 0.25:
            continue              # lost on the way
        arrive = t + rng.choice([0.0, rng.uniform(0, 0.5), rng.uniform(0, 4)])
        events.append((arrive, "etcd", t))
    events.sort()
    answers = []
    expired = False
    checks = sorted({e[0] for e in events} | {i * 0.05 for i in range(1300)})
    pending = list(events)
    for at in checks:
        now[0] = at
        while pending and pending[0][0] <= at:
            arrive, _, sent = pending.pop(0)
            if arrive >= etcd_expiry:
                expired = True
            if not expired:
                etcd_expiry = arrive + ttl
                if rng.random() < 0.8:
                    answers.append((arrive + rng.uniform(0, 2), sent))
        if at >= etcd_expiry:
            expired = True
        for a in [a for a in answers if a[0] <= at]:
            answers.remove(a)
            clock.renewed(a[1], ttl)
        if expired:
            assert clock.lapsed(), f"etcd expired the lease at {etcd_expiry:.2f}, the broker holds it to {clock.deadline:.2f}"


def test_prompt_keepalives_never_lapse_and_late_answers_do_not_move_it_back():
    now = [0.0]
    clock = LeaseClock(lambda: now[0])
    assert clock.lapsed()         # no session before the first grant
    for i in range(10):
        clock.renewed(now[0], 3)
        now[0] += 1.0
        assert not clock.lapsed()
    clock.renewed(2.0, 3)         # an old answer arriving late
    assert clock.deadline == 9.0 + 3
    clock.renewed(now[0], 0)      # an expired lease renews nothing
    assert clock.deadline == 12.0
    now[0] = 12.0
    assert clock.lapsed()


# -- the hand-over rule ------------------------------------------------------------------

ST = PartitionState("t", 0, (0, 1, 2), 0, 4, (0, 1, 2), version=7)


def test_leader_no_follower_reaches_hands_over_to_the_registered_followers():
    new = hand_over(ST, (0,), 2, {0, 1, 2})
    assert (new.leader, new.leader_epoch, new.isr) == (1, 5, (1, 2))
    assert new.replicas == ST.replicas


def test_a_leader_whose_isr_shrank_one_by_one_hands_to_the_last_follower():
    """Followers fall silent one lag check apart: the ISR shrinks to (0, 2) first, and
    when the leader would be alone, 2 leads alone until 1 catches up with it."""
    shrunk = PartitionState("t", 0, (0, 1, 2), 0, 4, (0, 2), version=8)
    new = hand_over(shrunk, (0,), 2, {0, 1, 2})
    assert (new.leader, new.leader_epoch, new.isr) == (2, 5, (2,))


@pytest.mark.parametrize("new_isr,min_isr,alive", [
    ((0, 1), 2, {0, 1, 2}),     # a follower still reaches it: a shrink still takes writes
    ((0, 2), 3, {0, 1, 2}),     # it hears a follower: shrink
    ((0,), 1, {0, 1, 2}),       # min.insync 1: the leader alone takes writes
    ((0,), 2, {0, 1}),          # an in-sync follower gone from etcd: really dead, shrink
    ((0,), 3, {0, 1, 2}),       # the others could not take writes either
])
def test_no_hand_over(new_isr, min_isr, alive):
    assert hand_over(ST, new_isr, min_isr, alive) is None


def test_no_bounce_while_the_new_leader_hears_a_follower():
    first = hand_over(ST, (0,), 2, {0, 1, 2})
    assert hand_over(first, (first.leader, 2), 2, {0, 1, 2}) is None
    assert hand_over(first, (first.leader,), 2, {0, 1, 2}).leader == 2   # alone again: it moves on


def test_no_hand_over_from_a_leaderless_or_single_replica_state():
    assert hand_over(PartitionState("t", 0, (0,), 0, 0, (0,)), (0,), 2, {0}) is None
    assert hand_over(PartitionState("t", 0, (0, 1, 2), NO_LEADER, 1, (1, 2)), (), 2, {1, 2}) is None


# -- the outage log --------------------------------------------------------------------

def test_outage_logs_twice_per_outage_with_the_count(caplog):
    out = OutageLog(logging.getLogger("t.outage"), "broker 1")
    with caplog.at_level(logging.WARNING, "t.outage"):
        out.ok()
        for _ in range(28):
            out.failed("ISR change of t-0", EtcdError("no etcd endpoint answered"))
        out.ok()
        out.ok()
        out.failed("watch", EtcdError("x"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "unreachable" in lines[0] and "after 28 failed" in lines[1] and "unreachable" in lines[2]
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in caplog.records)


# -- the view: fence on lapse, resume from fresh state ---------------------------------

class Fixture:
    def __init__(self, seed: int):
        self.now = [100.0]
        self.etcd = FakeEtcd(random.Random(seed))
        self.etcd.expired = set()
        self.views = [EtcdClusterView(self.etcd, "s", n, BrokerInfo(n, "h", 9092 + n), lease_ttl_s=3)
                      for n in range(2)]
        for v in self.views:
            v.session = LeaseClock(lambda: self.now[0])
        self.seen: list[PartitionState] = []
        self.views[0].add_listener(self.seen.append)

    async def start(self):
        for v in self.views:
            await v._register()
            await v._load()
        assert await self.views[0].create_topic("t", [(0, 1)], {}) == 0
        await self.views[1]._reload_topic("t")

    async def close(self):
        for v in self.views:
            v._stopping = True
            for task in v._tasks:
                task.cancel()
            await asyncio.gather(*v._tasks, return_exceptions=True)


@pytest.mark.parametrize("seed", range(20))
def test_fenced_view_shows_no_leadership_and_resumes_at_a_new_epoch(seed):
    asyncio.run(_fence_and_resume(seed))


async def _fence_and_resume(seed):
    f = Fixture(seed)
    await f.start()
    v = f.views[0]
    try:
        assert v.partition("t", 0).leader == 0 and not v.fenced
        f.now[0] += 3.0                # no keepalive came back within the TTL
        f.views[1].session.renewed(f.now[0], 3)      # the other broker's do
        assert v.fenced                # at once, before the guard acts
        assert v.partition("t", 0).leader == NO_LEADER and v.controller_id() is None
        assert all(st.leader == NO_LEADER for st in v.partitions() + v.topic_partitions("t"))
        with pytest.raises(EtcdError):
            await v.write_partition(v._parts[("t", 0)], v._parts[("t", 0)])
        v._fence()
        assert f.seen[-1].leader == NO_LEADER     # listeners dropped the role
        # etcd expired the lease meanwhile: the keepalive answers 0, the broker registers
        # again and resumes from what etcd holds.
        f.etcd.expired = f.etcd.expired | {v.lease}
        assert await f.etcd.lease_keepalive(v.lease) == 0
        await v._register()
        await v._resume()
        st = v.partition("t", 0)
        assert not v.fenced and st.leader == 0 and st.leader_epoch == 1
        assert f.seen[-1] == st
        stored = await f.views[1].read_partition("t", 0)
        assert (stored.leader, stored.leader_epoch) == (0, 1)
    finally:
        await f.close()


@pytest.mark.parametrize("seed", range(20))
def test_resume_follows_a_leader_elected_while_fenced(seed):
    asyncio.run(_resume_after_election(seed))


async def _resume_after_election(seed):
    f = Fixture(seed)
    await f.start()
    v, other = f.views
    try:
        f.now[0] += 3.0
        other.session.renewed(f.now[0], 3)
        v._fence()
        st = await other.read_partition("t", 0)
        assert await other.write_partition(st, PartitionState("t", 0, (0, 1), 1, 1, (1,))) is not None
        await v._register()
        await v._resume()
        mine = v.partition("t", 0)
        assert (mine.leader, mine.leader_epoch) == (1, 1)    # no epoch of its own on top
        assert f.seen[-1] == mine
    finally:
        await f.close()


def test_resume_stays_fenced_when_the_lease_lapsed_again_meanwhile():
    asyncio.run(_lapse_during_resume())


async def _lapse_during_resume():
    f = Fixture(0)
    await f.start()
    v = f.views[0]
    try:
        f.now[0] += 3.0
        v._fence()
        # The lease call and the re-read take longer than the TTL.
        orig = f.etcd.get_prefix

        async def slow(prefix):
            f.now[0] += 5.0
            return await orig(prefix)
        f.etcd.get_prefix = slow
        await v._register()
        await v._resume()
        assert v.fenced and v.partition("t", 0).leader == NO_LEADER
    finally:
        await f.close()

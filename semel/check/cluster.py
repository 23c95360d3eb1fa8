"""`semel check --cluster`: a local semel cluster (etcd and N brokers) that check
starts itself, and the nemesis that kills and pauses its brokers.

The nemesis aims at the roles replication must survive:
  leader-kill    SIGKILL the leader of a check-topic partition, restart it on the
                 same port and data after a short outage
  follower-kill  SIGKILL a broker that follows some partition (in its ISR)
  broker-pause   SIGSTOP a broker, SIGCONT it later; half the pauses outlast the
                 lease TTL, so its session expires and its partitions elect anew
  power-loss     the power of one broker, or of every broker and etcd at once, goes:
                 SIGKILL, then its power-cut disk (semel.launch.lazyfs) drops all it had
                 not fsynced, creations, renames and removals included; then on again
  disk           a broker's disk fails: every fsync and write of its data directory
                 raises EIO for a while (the storage seam's faults, armed in the
                 running process), then works again
  clock          a broker's wall clock steps an hour forward or back for a while
                 (semel.clock's test-only step file), then back
  partition      the network splits for a while (semel.launch.netns: etcd, every broker
                 and check's own clients each in a network namespace): a broker cut from
                 everything, from its peers and etcd while clients still reach it, from
                 etcd only, or its packets to its peers dropped one way; then it heals
After each episode the nemesis waits (bounded) for every partition to have a
leader and a full ISR again, so one fault never stacks on the last one's
shrunken ISR: with RF3 and min.insync.replicas 2 that would only refuse writes.

The group and transaction coordinators live on the leaders of `__consumer_offsets`
and `__transaction_state` (docs/cluster.md, "Coordinators"); their brokers are left
alone unless `nemesis_coordinator` is set, which aims faults at coordinator failover
too (the coordinators move with their partitions' leadership). Sparing them needs them
on one broker, so without it the brokers run one partition per internal topic; with it
they keep the default several, spread over the brokers.

Each episode draws the same random numbers whatever the cluster looks like (the
victim is picked with one rng.random()), so with cluster faults only, a seed fixes
the sequence of fault kinds and their timings.
"""
from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

from ..clock import STEP_FILE_ENV
from ..launch.lazyfs import FuseUnavailable, PowerCutDisk
from ..launch.local_cluster import LocalCluster
from ..launch.netns import Network, place
from ..launch.netns import available as netns_unavailable
from .errors import WorkloadError
from .history import NEMESIS
from .threads import blocking

CLUSTER_FAULTS = ("leader-kill", "follower-kill", "broker-pause", "power-loss", "disk", "clock", "partition")
# Faults the brokers must be set up for when the cluster starts (disks, seams, a network).
SETUP_FAULTS = frozenset({"power-loss", "disk", "clock", "partition"})
# How a partition cuts its victim off (chosen by the episode's draw).
CUTS = ("isolated", "from peers and etcd", "from etcd", "one way to peers")
# Kafka's names of the coordinators' topics: their partitions' leaders are the coordinators.
INTERNAL_TOPICS = ("__transaction_state", "__consumer_offsets")
REPLICA_LAG_MS = 5000        # a paused follower leaves the ISR after this (the broker's default is 30 s)
SETTLE_TIMEOUT_S = 30.0
SESSION_SLACK_S = 1.0        # etcd expires leases a little after their TTL      # for leaders and full ISRs after an episode
RESTART_ATTEMPTS = 5


class ClusterStartError(RuntimeError):
    pass


@dataclass(frozen=True)
class View:
    """The cluster as Metadata shows it: the controller, {partition: (leader,
    leader_epoch, isr)} of the check topic, and the brokers where the coordinators live
    (the leaders of the internal topics' partitions, once they exist)."""

    controller: int
    partitions: dict
    coordinators: frozenset = frozenset()

    def epochs(self) -> dict:
        return {p: epoch for p, (_, epoch, _) in self.partitions.items()}

    def settled(self, nodes: int) -> bool:
        return bool(self.partitions) and all(leader >= 0 and len(isr) == nodes
                                             for leader, _, isr in self.partitions.values())


def pick(x: float, candidates: list):
    """The candidate at x in [0, 1): one draw whatever the number of candidates
    (None when there are none)."""
    return candidates[int(x * len(candidates))] if candidates else None


class CheckCluster:
    """A LocalCluster under data_dir whose brokers the nemesis may kill and pause."""

    def __init__(self, data_dir: Path, nodes: int = 3, lease_ttl_s: int = 3, nemesis_coordinator: bool = False,
                 faults: tuple[str, ...] = ()):
        if nodes < 3:
            raise ClusterStartError("--cluster needs at least 3 nodes (replication factor 3)")
        self.nodes = nodes
        self.lease_ttl_s = lease_ttl_s
        self.nemesis_coordinator = nemesis_coordinator
        # Sparing the coordinators' brokers needs them on one broker: one partition per
        # internal topic. Aimed at the coordinators, they keep the default partitions,
        # spread over the brokers, and move as any of them fails.
        one_coordinator = [] if nemesis_coordinator else ["--transaction-state-partitions", "1",
                                                          "--offsets-topic-partitions", "1"]
        self.local = LocalCluster(Path(data_dir), nodes, lease_ttl_s=lease_ttl_s,
                                  broker_args=["--replica-lag-time-max-ms", str(REPLICA_LAG_MS),
                                               "--group-initial-rebalance-delay-ms", "0", *one_coordinator])
        self.seams = FaultSeams(Path(data_dir), self.local, set(faults) & SETUP_FAULTS)
        self.paused: set[int] = set()
        self.topic: str | None = None
        self.first_view: View | None = None
        self.episodes: dict[str, int] = {}

    @property
    def bootstrap(self) -> str:
        return self.local.bootstrap

    def start(self, timeout_s: float = 60.0) -> None:
        try:
            self.seams.start()
            self.local.start(timeout_s)
        except (RuntimeError, TimeoutError, OSError) as exc:
            self.close()
            raise ClusterStartError(f"cannot start the local cluster under {self.local.data_dir}: {exc}") from None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._registered() == set(range(self.nodes)):
                return
            time.sleep(0.2)
        self.close()
        raise ClusterStartError(f"brokers did not all register within {timeout_s:.0f}s "
                                f"(logs under {self.local.data_dir})")

    def stop(self) -> None:
        for n in sorted(self.paused):
            self.local.brokers[n].resume()
        self.paused.clear()
        self.local.stop()

    def close(self) -> None:
        self.local.close()
        self.seams.stop()

    # ------------------------------------------------------------ reading state

    def _metadata(self, topics):
        return self.local.metadata(topics, skip=self.paused)

    def _registered(self) -> set[int]:
        md = self._metadata([])
        return {b.node_id for b in md.brokers} if md is not None else set()

    def view(self) -> View | None:
        md = self._metadata([self.topic, *INTERNAL_TOPICS])
        ours = [t for t in md.topics if t.name == self.topic] if md is not None else []
        if not ours or ours[0].error_code:
            return None
        coordinators = frozenset(p.leader_id for t in md.topics if t.name in INTERNAL_TOPICS and not t.error_code
                                 for p in t.partitions if p.leader_id >= 0)
        return View(md.controller_id, {p.partition_index: (p.leader_id, p.leader_epoch, tuple(p.isr_nodes))
                                       for p in ours[0].partitions}, coordinators)

    def wait_settled(self, timeout_s: float = SETTLE_TIMEOUT_S) -> View | None:
        """The view once every partition has a leader and a full ISR; None after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            v = self.view()
            if v is not None and v.settled(self.nodes):
                return v
            time.sleep(0.2)
        return None

    def topic_ready(self, topic: str) -> View | None:
        """Called once the workload created its topic: the starting view, kept for the report."""
        self.topic = topic
        self.first_view = self.wait_settled()
        return self.first_view

    def summary(self) -> dict:
        """Epochs at the start and now, the controller, episodes: for summary.json."""
        last = self.view() if self.topic else None
        return {"nodes": self.nodes, "lease_ttl_s": self.lease_ttl_s,
                "nemesis_coordinator": self.nemesis_coordinator,
                "controller": last.controller if last else None,
                "epochs_start": self.first_view.epochs() if self.first_view else None,
                "epochs_end": last.epochs() if last else None,
                "episodes": dict(sorted(self.episodes.items()))}

    # ------------------------------------------------------------ victims

    def _spared(self, v: View) -> set[int]:
        return set() if self.nemesis_coordinator else set(v.coordinators)

    def leaders(self, v: View) -> list[tuple[int, int]]:
        """(partition, leader) pairs whose leader the nemesis may take down."""
        spared = self._spared(v)
        return [(p, leader) for p, (leader, _, _) in sorted(v.partitions.items())
                if leader >= 0 and leader not in spared]

    def followers(self, v: View) -> list[int]:
        spared = self._spared(v)
        return sorted({r for leader, _, isr in v.partitions.values() for r in isr if r != leader} - spared)

    def pausable(self, v: View) -> list[int]:
        return sorted(set(range(self.nodes)) - self._spared(v))

    # ------------------------------------------------------------ episodes

    async def fault(self, name: str, rng: random.Random, wl) -> None:
        """Run one nemesis episode of kind `name`, recorded in the workload's history."""
        x, hold = rng.random(), self._hold(name, rng)   # drawn first: the schedule does not depend on the cluster
        v = await blocking(self.view)
        if v is None:
            wl.note("cluster-no-view", fault=name)
            return
        if name in SETUP_FAULTS:
            await self._seam_fault(name, x, hold, v, wl)
            return
        if name == "leader-kill":
            choice = pick(x, self.leaders(v))
            victim, partition = (choice[1], choice[0]) if choice else (None, None)
        elif name == "follower-kill":
            victim, partition = pick(x, self.followers(v)), None
        else:
            victim, partition = pick(x, self.pausable(v)), None
        if victim is None:
            wl.note("cluster-no-victim", fault=name, controller=v.controller)
            return
        f = {"leader-kill": "kill-leader", "follower-kill": "kill-follower", "broker-pause": "pause-broker"}[name]
        led = sorted(p for p, (leader, _, _) in v.partitions.items() if leader == victim)
        wl.record({"process": NEMESIS, "type": "invoke", "f": f,
                   "value": {"node": victim, "partition": partition, "leads": led, "hold_s": hold,
                             "controller": v.controller, "coordinators": sorted(v.coordinators),
                             "epochs": v.epochs()}})
        if name == "broker-pause":
            await self._pause(victim, hold)
        else:
            await self._bounce(victim, hold)
        self.episodes[f] = self.episodes.get(f, 0) + 1
        after = await blocking(self.wait_settled)
        wl.note(f, node=victim, hold_s=hold, settled=after is not None,
                epochs=after.epochs() if after else None, controller=after.controller if after else None)

    async def _seam_fault(self, name: str, x: float, hold: float, v: View, wl) -> None:
        """power-loss, disk and clock: one episode, recorded, then wait to settle."""
        whole = name == "power-loss" and x >= 0.5     # half the power cuts take the whole cluster
        victim = None if whole else pick(x * 2 % 1, self.pausable(v))
        if victim is None and not whole:
            wl.note("cluster-no-victim", fault=name, controller=v.controller)
            return
        step = 3600 if x * 4 % 1 < 0.5 else -3600
        value = {"node": victim, "whole_cluster": whole, "hold_s": hold, "controller": v.controller,
                 "epochs": v.epochs()}
        if name == "clock":
            value["step_s"] = step
        cut = CUTS[int(x * 8 % 1 * len(CUTS))]
        if name == "partition":
            value["cut"] = cut
        wl.record({"process": NEMESIS, "type": "invoke", "f": name, "value": value})
        if name == "power-loss":
            await blocking(self.seams.power_cut, None if whole else victim, int(x * 1000))
        elif name == "partition":
            await blocking(self.seams.cut, victim, cut)
            await asyncio.sleep(hold)
            await blocking(self.seams.heal)
        elif name == "disk":
            await blocking(self.seams.arm_disk, victim, "fail_next_fsync=100000000,fail_next_write=100000000")
            await asyncio.sleep(hold)
            await blocking(self.seams.arm_disk, victim, "clear=1")
        else:
            await blocking(self.seams.step_clock, victim, step)
            await asyncio.sleep(hold)
            await blocking(self.seams.step_clock, victim, 0)
        self.episodes[name] = self.episodes.get(name, 0) + 1
        after = await blocking(self.wait_settled, SETTLE_TIMEOUT_S * (3 if whole or name == "partition" else 1))
        wl.note(name, node=victim, whole_cluster=whole, hold_s=hold, settled=after is not None,
                epochs=after.epochs() if after else None, controller=after.controller if after else None)

    def _hold(self, name: str, rng: random.Random) -> float:
        """Outage length: kills 0.1-1.5 s; pauses either within the lease TTL or
        past it (1.5-2.5 TTL), half each, so some pauses end the broker's session;
        a failing disk, a stepped clock or a network cut 2-8 s; a power cut is over at once."""
        if name in ("disk", "clock", "partition"):
            return round(rng.uniform(2.0, 8.0), 2)
        if name != "broker-pause":
            return round(rng.uniform(0.1, 1.5), 2)
        ttl = self.lease_ttl_s
        short, long_ = rng.uniform(0.3, 0.8 * ttl), rng.uniform(1.5 * ttl, 2.5 * ttl)
        return round(short if rng.random() < 0.5 else long_, 2)

    async def _pause(self, node: int, seconds: float) -> None:
        b = self.local.brokers[node]
        self.paused.add(node)
        try:
            b.pause()
            await asyncio.sleep(seconds)
        finally:
            b.resume()
            self.paused.discard(node)

    async def _bounce(self, node: int, down_s: float) -> None:
        b = self.local.brokers[node]
        await blocking(b.kill)
        session_over = time.monotonic() + self.lease_ttl_s + SESSION_SLACK_S
        await asyncio.sleep(down_s)
        for _ in range(RESTART_ATTEMPTS):
            try:
                await blocking(b.start, 60)
                break
            except (RuntimeError, TimeoutError, OSError):
                await asyncio.sleep(1.0)
        else:
            raise WorkloadError(f"broker {node} did not come back after a kill (log: {b.log_path})")
        # The restarted broker listens at once but registers only when its old session
        # has expired, and only then does the controller move what it led: until then
        # Metadata still shows the old leaders and ISRs, which would pass for settled.
        await asyncio.sleep(max(0.0, session_over - time.monotonic()))


class FaultSeams:
    """What the brokers are set up with for the faults that need it: power-cut disks
    under every broker's and etcd's data (power-loss), a fault control file per broker
    (disk), a clock step file per broker (clock)."""

    def __init__(self, root: Path, local: LocalCluster, faults: set[str]):
        self.root, self.local, self.faults = root, local, faults
        self.disks: dict[str, PowerCutDisk] = {}
        self.net: Network | None = None
        if "partition" in faults:
            # etcd first: the brokers are made again to name it at its address there.
            n_brokers = len(local.brokers)
            self.net = Network([*(f"b{n}" for n in range(n_brokers)), "etcd", "client"])
            place(local.etcd, self.net, "etcd")
            local.brokers = [place(local.new_broker(n), self.net, f"b{n}") for n in range(n_brokers)]
        for n, b in enumerate(local.brokers):
            if "disk" in faults:
                b.env["SEMEL_FS_FAULTS"] = f"control_file={self._control(n)}"
            if "clock" in faults:
                b.env[STEP_FILE_ENV] = str(self._clock(n))
        if "power-loss" in faults:
            names = [f"broker-{n}" for n in range(len(local.brokers))] + ["etcd"]
            self.disks = {name: PowerCutDisk(root / "power-cut-backing" / name, root / name) for name in names}

    def _control(self, n: int) -> Path:
        return self.root / f"disk-faults-{n}"

    def _clock(self, n: int) -> Path:
        return self.root / f"clock-step-{n}"

    def start(self) -> None:
        try:
            for disk in self.disks.values():
                disk.start()
        except FuseUnavailable as exc:
            self.stop()
            raise ClusterStartError(f"power-loss needs FUSE: {exc}") from None
        if self.net is not None:
            why = netns_unavailable()
            if why:
                self.stop()
                raise ClusterStartError(f"partition needs network namespaces: {why}")
            self.net.create()
            # check's own clients (the workers it starts, its Metadata reads) are one
            # more host: the calling thread moves there, and all it starts from now on.
            self.net.enter("client")

    def stop(self) -> None:
        for disk in self.disks.values():
            disk.stop()
        if self.net is not None:
            self.net.close()

    def cut(self, node: int, how: str) -> None:
        assert self.net is not None
        me = f"b{node}"
        peers = [f"b{n}" for n in range(len(self.local.brokers)) if n != node]
        if how == "isolated":
            self.net.isolate(me)
        elif how == "from peers and etcd":
            self.net.isolate(me, [*peers, "etcd"])
        elif how == "from etcd":
            self.net.cut(me, "etcd")
        else:
            for peer in peers:
                self.net.cut(me, peer, one_way=True)

    def heal(self) -> None:
        assert self.net is not None
        self.net.heal()

    def power_cut(self, node: int | None, turn: int) -> None:
        """Cut one broker's power (node), or every broker's and etcd's (None), and
        switch them on again: etcd first, the brokers in an order `turn` rotates."""
        brokers = self.local.brokers if node is None else [self.local.brokers[node]]
        for b in brokers:
            b.kill()
        if node is None:
            self.local.etcd.kill()
        names = ["etcd", *(f"broker-{n}" for n in range(len(self.local.brokers)))] if node is None \
            else [f"broker-{node}"]
        for name in names:
            self.disks[name].cut()
        if node is None:
            self.local.etcd.start()
        turn %= len(brokers)
        for b in brokers[turn:] + brokers[:turn]:
            for _ in range(RESTART_ATTEMPTS):
                try:
                    b.start(60)
                    break
                except (RuntimeError, TimeoutError, OSError):
                    time.sleep(1.0)
            else:
                raise WorkloadError(f"a broker did not come back after a power cut (log: {b.log_path})")

    def arm_disk(self, node: int, spec: str) -> None:
        """Arm storage faults in a running broker; returns once it took them."""
        _replace(self._control(node), spec)
        deadline = time.monotonic() + 10
        while self._control(node).exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    def step_clock(self, node: int, seconds: int) -> None:
        _replace(self._clock(node), str(seconds))


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)

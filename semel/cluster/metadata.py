"""`EtcdClusterView`, a broker's live view of the cluster's metadata in etcd (the keys
and their values: semel.cluster.keys; the topic catalogue's writes:
semel.cluster.topic_catalogue).

Every change of a partition is a transaction comparing its version (the etcd
mod_revision of its key): whoever read an older state loses and must re-read. A
lease-bound key disappears when its owner stops refreshing the lease (killed, paused,
cut off), which is how the controller learns a broker is gone and how a dead
controller's seat falls vacant.

The view holds a cache filled by one range read and kept current by a watch from
the revision after it; listeners run on the event loop in revision order.

A broker whose lease may have ended is fenced (semel.cluster.session.LeaseClock: no
keepalive came back renewed within the TTL of its sending). While fenced the view
shows every partition without a leader and no controller, to its listeners (the
replica manager and coordinator seats drop their roles, failing what they hold) and
to every reader (produce, fetch and Metadata answer as for a partition without a
leader here), and refuses partition writes. Once a keepalive succeeds again (after
registering anew when the lease had ended) it reads the whole state afresh, watches
from there, starts a new leader epoch for each partition the fresh state still says
this broker leads (so its coordinators load again, and nothing of the old epoch's
roles is trusted), and only then shows the real states again.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import replace
from typing import Awaitable, Callable, Protocol

from ..backoff import Backoff
from ..protocol.errors import KafkaError
from .etcd import KV, Etcd, EtcdError, mod_equals, put_op
from .keys import KeyCache, Keys, TopicInfo, decode_partition, decode_topic, encode_partition
from .session import LeaseClock, OutageLog
from .state import NO_LEADER, BrokerInfo, ClusterView, PartitionListener, PartitionState
from .topic_catalogue import GrowthDecision, TopicCatalogue

log = logging.getLogger("semel.cluster.metadata")


ChangeListener = Callable[[], None]


class ClusterMetadata(ClusterView, Protocol):
    """The cluster view with its topic catalogue and cluster-wide configs: what the
    broker's request handlers read and write (semel.broker.services)."""

    def topics(self) -> dict[str, TopicInfo]: ...

    def topic_partitions(self, name: str) -> list[PartitionState]: ...

    async def create_topic(self, name: str, assignment: list[tuple[int, ...]], configs: dict[str, str]) -> KafkaError: ...

    async def delete_topic(self, name: str, topic_id: str | None = None) -> KafkaError: ...

    async def add_partitions(self, name: str, decide: GrowthDecision) -> tuple[KafkaError, str]: ...

    async def set_config(self, name: str, value: str | None) -> None: ...


class EtcdClusterView:
    """ClusterView over etcd for broker `node_id` (see semel.cluster.state).

    start() registers the broker under a lease (refreshed every ttl/3) and starts the
    watch; the broker is live for the others from then until stop() or until it stops
    refreshing. Beyond the contract: topics(), create_topic(), write_partition() and
    try_become_controller() for the controller and the admin handlers, and
    add_change_listener() for anything else that changed (brokers, controller, topics).
    """

    def __init__(self, etcd: Etcd, cluster_id: str, node_id: int, info: BrokerInfo, lease_ttl_s: int = 6):
        self.etcd = etcd
        self.keys = Keys(cluster_id)
        self.node_id = node_id
        self.info = info
        self.lease_ttl_s = max(2, int(lease_ttl_s))
        self.lease = 0
        self._brokers: dict[int, BrokerInfo] = {}
        self._topics: dict[str, TopicInfo] = {}
        self._deleted: dict[str, TopicInfo] = {}     # deletion markers, by name
        self._deleted_at: dict[str, int] = {}        # revision of the last deletion seen, by name
        self._parts: dict[tuple[str, int], PartitionState] = {}
        self._controller: int | None = None
        self._listeners: list[PartitionListener] = []
        self._change_listeners: list[ChangeListener] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._pid_lock = asyncio.Lock()
        self._caches: dict[str, KeyCache] = {}      # full key prefix -> cache (key_cache)
        self._configs = self.key_cache("configs/")
        self.session = LeaseClock()
        self._fenced = False     # set once the lapse was acted on; cleared by _resume only
        self.outage = OutageLog(log, f"broker {node_id}")
        self.catalogue = TopicCatalogue(etcd, self.keys, self._reload_topic)

    # --- lifecycle -------------------------------------------------------------

    async def start(self, before_register: Callable[[], Awaitable[None]] | None = None) -> None:
        """Register and follow. `before_register` runs once this node id's previous
        session has ended and before this one begins: what the broker must change in
        etcd while no other broker can see it live."""
        await self._await_previous_session()
        if before_register is not None:
            await before_register()
        await self._register()
        revision = await self._load()
        self._tasks = [asyncio.create_task(self._watch(revision), name="cluster-watch"),
                       asyncio.create_task(self._keepalive(), name="cluster-lease"),
                       asyncio.create_task(self._guard(), name="cluster-session-guard")]

    async def stop(self) -> None:
        self._stopping = True   # the loops end on it even where a cancel gets swallowed
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.lease:
            try:   # our keys (broker, controller) go at once instead of after the TTL
                await self.etcd.lease_revoke(self.lease)
            except EtcdError as exc:
                log.warning("could not revoke lease: %s", exc)
        await self.etcd.close()

    async def _await_previous_session(self) -> None:
        """Register only once this node id's previous session has ended (Kafka's rule for
        broker registration). A broker SIGKILLed and restarted within its TTL would
        otherwise slip back in unseen, and the controller would never move the leadership
        it lost with its memory; a second live broker configured with the same node id is
        refused (ValueError: the start fails in one line) instead of the two fighting."""
        key = self.keys.broker(self.node_id)
        kv = await self.etcd.get(key)
        if kv is None:
            return
        granted = await self.etcd.lease_granted_ttl(kv.lease) if kv.lease else -1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(granted, 0) + 2
        log.info("node id %d still registered (lease %x, ttl %ds): waiting for that session to end",
                 self.node_id, kv.lease, granted)
        while (kv := await self.etcd.get(key)) is not None:
            if loop.time() > deadline:
                d = json.loads(kv.value)
                raise ValueError(f"node id {self.node_id} is registered by a live broker at "
                                 f"{d.get('host')}:{d.get('port')}; give each broker its own --node-id")
            await asyncio.sleep(0.2)

    async def _register(self) -> None:
        sent = self.session.clock()
        self.lease = await self.etcd.lease_grant(self.lease_ttl_s, self.lease_ttl_s)
        self.session.renewed(sent, self.lease_ttl_s)
        body = json.dumps({"node_id": self.node_id, "host": self.info.host, "port": self.info.port,
                           "rack": self.info.rack, "endpoints": [list(e) for e in self.info.endpoints]}).encode()
        await self.etcd.put(self.keys.broker(self.node_id), body, lease=self.lease)

    async def _keepalive(self) -> None:
        """A keepalive every third of the TTL, each in its own task: a slow answer still
        renews from its send time, so none is cut short, and a slow one does not hold
        back the next (an answer later than the TTL renews nothing)."""
        lock = asyncio.Lock()
        pending: set[asyncio.Task[None]] = set()
        try:
            while not self._stopping:
                await asyncio.sleep(self.lease_ttl_s / 3)
                task = asyncio.create_task(self._renew(lock), name="cluster-lease-renew")
                pending.add(task)
                task.add_done_callback(pending.discard)
        finally:
            for task in list(pending):
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _renew(self, lock: asyncio.Lock) -> None:
        sent, lease = self.session.clock(), self.lease
        try:
            ttl = await self.etcd.lease_keepalive(lease, self.lease_ttl_s)
        except EtcdError as exc:
            self.outage.failed("lease keepalive", exc)
            return
        self.outage.ok()
        async with lock:     # one registration or resumption at a time
            if lease != self.lease:
                return       # an answer about a lease already replaced
            try:
                if ttl > 0:
                    self.session.renewed(sent, ttl)
                else:
                    # Expired while we were stopped or cut off: the cluster saw this broker
                    # die; come back as a new session (the controller treats it as a return).
                    log.warning("broker %d lease expired; registering again", self.node_id)
                    await self._register()
                if self._fenced:
                    await self._resume()
            except EtcdError as exc:
                self.outage.failed("registering again", exc)

    @property
    def fenced(self) -> bool:
        """True while this broker may not act on its roles: its lease may have ended
        (checked at each call, so a request never waits for the guard), or it has not
        yet taken fresh state since it did."""
        return self._fenced or (self.lease != 0 and self.session.lapsed())

    async def _guard(self) -> None:
        """Act on a lapse as it happens: drop every role and fail what they hold, even
        when no request comes to find the lapse."""
        while not self._stopping:
            if not self._fenced and self.fenced:
                self._fence()
            wait = self.lease_ttl_s / 3 if self._fenced else min(max(self.session.remaining(), 0.02),
                                                                 self.lease_ttl_s / 3)
            await asyncio.sleep(wait)

    def _fence(self) -> None:
        self._fenced = True
        log.warning("broker %d: no lease renewal for %ds: its etcd session may have ended; giving up "
                    "leadership and coordination until it has registered and read the cluster afresh",
                    self.node_id, self.lease_ttl_s)
        for st in list(self._parts.values()):
            self._notify(st)
        self._changed()

    async def _resume(self) -> None:
        """After a lapse, with the lease renewed (or a new one): fresh state, a fresh watch,
        a new epoch for what this broker still leads, then the real states to listeners."""
        revision = await self._reload()
        watch = next((t for t in self._tasks if t.get_name() == "cluster-watch"), None)
        if watch is not None:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            self._tasks.remove(watch)
        self._tasks.append(asyncio.create_task(self._watch(revision), name="cluster-watch"))
        for st in [st for st in self._parts.values() if st.leader == self.node_id]:
            new = replace(st, leader_epoch=st.leader_epoch + 1)
            rev = await self.etcd.cas(self.keys.partition(st.topic, st.partition), encode_partition(new),
                                      st.version)
            if rev is not None:
                self._cache(replace(new, version=rev), notify=False)
        if self.session.lapsed():
            return     # lapsed again meanwhile: the next renewal tries again
        self._fenced = False
        log.warning("broker %d: etcd session renewed and state re-read; taking up its roles again", self.node_id)
        for st in list(self._parts.values()):
            self._notify(st)
        self._changed()

    def _shown(self, st: PartitionState) -> PartitionState:
        """What readers and listeners see of a partition: leaderless while fenced."""
        if self.fenced and st.leader != NO_LEADER:
            return replace(st, leader=NO_LEADER)
        return st

    def _notify(self, st: PartitionState) -> None:
        shown = self._shown(st)
        for fn in list(self._listeners):
            fn(shown)

    def _topics_first(self, kvs: list[KV]) -> list[KV]:
        """A range read returns keys sorted, partitions/ before topics/: listeners should
        hear of a topic before its partitions, as a watch delivers a create."""
        return sorted(kvs, key=lambda kv: kv.key.startswith(self.keys.partitions))

    async def _load(self) -> int:
        kvs, revision = await self.etcd.get_prefix(self.keys.root)
        for kv in self._topics_first(kvs):
            self._apply(kv, deleted=False, notify=False)
        return revision

    async def _watch(self, revision: int) -> None:
        # The pause grows while etcd stays away, so an outage is not a busy loop of warnings.
        pace = Backoff(math.inf, first_s=0.2, max_s=2.0)
        while not self._stopping:
            try:
                async for events in self.etcd.watch_prefix(self.keys.root, revision + 1):
                    pace.progress()
                    for ev in events:
                        self._apply(ev.kv, ev.kind == "DELETE", notify=True)
                        revision = max(revision, ev.kv.mod_revision)
                    self._changed()
            except (EtcdError, OSError, asyncio.TimeoutError, ValueError) as exc:
                self.outage.failed("watch", exc)
            except Exception as exc:   # aiohttp's payload errors and the like: same remedy
                log.warning("cluster watch failed (%r); re-reading", exc)
            await asyncio.sleep(pace.step())
            try:
                revision = await self._reload()
                self.outage.ok()
            except EtcdError as exc:
                self.outage.failed("re-read after the watch ended", exc)

    async def _reload(self) -> int:
        """A fresh snapshot after the watch broke (events may have been missed)."""
        kvs, revision = await self.etcd.get_prefix(self.keys.root)
        self._brokers.clear()
        self._topics.clear()
        self._deleted.clear()
        self._controller = None
        for cache in self._caches.values():
            cache.reset()
        seen = set()
        for kv in self._topics_first(kvs):
            self._apply(kv, deleted=False, notify=True)
            if kv.key.startswith(self.keys.partitions):
                seen.add(kv.key)
        for (topic, index) in list(self._parts):
            if self.keys.partition(topic, index) not in seen:
                del self._parts[(topic, index)]
        self._changed()
        return revision

    def _apply(self, kv: KV, deleted: bool, notify: bool) -> None:
        k = self.keys
        if kv.key.startswith(k.brokers):
            node = int(kv.key[len(k.brokers):])
            if deleted:
                self._brokers.pop(node, None)
            else:
                d = json.loads(kv.value)
                self._brokers[node] = BrokerInfo(node, d["host"], d["port"], d.get("rack"),
                                                 tuple((n, h, p) for n, h, p in d.get("endpoints") or ()))
        elif kv.key == k.controller:
            self._controller = None if deleted else json.loads(kv.value)["node_id"]
        elif kv.key.startswith(k.topics):
            self._apply_topic(kv.key[len(k.topics):], kv, deleted)
        elif kv.key.startswith(k.partitions):
            topic, _, index = kv.key[len(k.partitions):].rpartition("/")
            tp = (topic, int(index))
            if deleted:
                cur = self._parts.get(tp)
                if cur is not None and cur.version < kv.mod_revision:   # not a newer incarnation's
                    del self._parts[tp]
                return
            # Only partitions of the incarnation this view holds: created with it or since,
            # not by a later re-creation whose topic has not reached this view yet.
            info = self._topics.get(topic)
            if info is not None and kv.create_revision <= info.version:
                self._cache(decode_partition(topic, int(index), kv), notify)
        else:
            for prefix, cache in self._caches.items():
                if kv.key.startswith(prefix):
                    cache.apply(kv.key[len(prefix):], kv, deleted)
                    break

    def _apply_topic(self, name: str, kv: KV, deleted: bool) -> None:
        """Newest version wins: our own reads after a write and the watch both arrive."""
        cur = self._topics.get(name) or self._deleted.get(name)
        if cur is not None and cur.version > kv.mod_revision:
            return
        self._topics.pop(name, None)
        self._deleted.pop(name, None)
        if deleted:
            return
        info = decode_topic(name, kv)
        (self._deleted if info.deleted else self._topics)[name] = info
        if info.deleted:   # its partitions went in the same transaction
            self._deleted_at[name] = max(self._deleted_at.get(name, 0), info.version)
            for tp in [tp for tp in self._parts if tp[0] == name]:
                del self._parts[tp]

    def _cache(self, st: PartitionState, notify: bool) -> None:
        """Keep the newest version only: our own CAS result and the watch both arrive.
        Nothing of a deleted incarnation: older than the last deletion this view saw."""
        if st.topic not in self._topics or st.version <= self._deleted_at.get(st.topic, 0):
            return
        cur = self._parts.get((st.topic, st.partition))
        if cur is not None and cur.version >= st.version:
            return
        self._parts[(st.topic, st.partition)] = st
        if notify:
            self._notify(st)

    def _changed(self) -> None:
        for fn in list(self._change_listeners):
            fn()

    # --- ClusterView ------------------------------------------------------------

    def brokers(self) -> dict[int, BrokerInfo]:
        return dict(self._brokers)

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        st = self._parts.get((topic, partition))
        return self._shown(st) if st is not None else None

    def partitions(self) -> list[PartitionState]:
        return [self._shown(st) for st in self._parts.values()]

    def controller_id(self) -> int | None:
        return None if self.fenced else self._controller

    async def alter_isr(self, state: PartitionState, isr: tuple[int, ...]) -> PartitionState | None:
        if state.leader != self.node_id or not isr or not set(isr) <= set(state.replicas):
            return None
        return await self.write_partition(state, replace(state, isr=tuple(isr)))

    async def allocate_producer_ids(self, block_size: int) -> int:
        """Advance the cluster-wide counter by CAS; retried until this broker wins."""
        async with self._pid_lock:
            while True:
                kv = await self.etcd.get(self.keys.producer_ids)
                first = json.loads(kv.value)["next"] if kv else 0
                body = json.dumps({"next": first + block_size}).encode()
                if await self.etcd.cas(self.keys.producer_ids, body, kv.mod_revision if kv else 0) is not None:
                    return first

    def add_listener(self, fn: PartitionListener) -> None:
        self._listeners.append(fn)

    # --- beyond the contract -------------------------------------------------------

    def key_cache(self, subtree: str) -> KeyCache:
        """The cache of keys under `<root><subtree>` (e.g. "users/"); register it before
        start() so the first range read fills it."""
        return self._caches.setdefault(self.keys.root + subtree, KeyCache())

    def config(self, name: str) -> str | None:
        """A cluster-wide dynamic broker config (e.g. the replication throttle), None when unset."""
        item = self._configs.items.get(name)
        return item.get("value") if isinstance(item, dict) else None

    async def set_config(self, name: str, value: str | None) -> None:
        """Set (None: remove) a cluster-wide dynamic broker config; every broker's view
        follows through the watch, this one at once."""
        key = self.keys.root + "configs/" + name
        if value is None:
            await self.etcd.delete(key)
            self._configs.drop(name, (await self.etcd.get_prefix(key))[1])
        else:
            self._configs.put(name, {"value": value}, await self.etcd.put(key, json.dumps({"value": value}).encode()))

    def add_change_listener(self, fn: ChangeListener) -> None:
        self._change_listeners.append(fn)

    def topics(self) -> dict[str, TopicInfo]:
        """Live topics (deleted ones are in deleted_topics())."""
        return dict(self._topics)

    def deleted_topics(self) -> dict[str, TopicInfo]:
        """Deletion markers by name: topics deleted and not created again since."""
        return dict(self._deleted)

    def topic_partitions(self, name: str) -> list[PartitionState]:
        """A topic's partitions as Metadata answers clients. While fenced, a partition this
        broker led shows no leader (another may have taken over) and every other keeps
        the leader last heard of, as a Kafka broker cut off from its controller answers
        from its cache: a client that asks this broker is not told that partitions whose
        leaders are healthy have none, which would stop its writes to them until the cut
        heals; a leader that has moved meanwhile answers NOT_LEADER_OR_FOLLOWER and the
        client asks again."""
        info = self._topics.get(name)
        if info is None:
            return []
        parts = [p for p in (self._parts.get((name, i)) for i in range(info.partitions)) if p is not None]
        return [self._shown(p) if p.leader == self.node_id else p for p in parts]

    async def write_partition(self, old: PartitionState, new: PartitionState) -> PartitionState | None:
        """CAS `new` over `old` (compared by version); the stored state or None when it lost.
        EtcdError while fenced: what this broker holds may be stale, and a decision taken
        on it must not be written."""
        if self.fenced:
            raise EtcdError(f"broker {self.node_id} is fenced: its etcd session lapsed")
        rev = await self.etcd.cas(self.keys.partition(old.topic, old.partition), encode_partition(new), old.version)
        if rev is None:
            return None
        stored = replace(new, version=rev)
        self._cache(stored, notify=True)
        return stored

    async def read_partition(self, topic: str, partition: int) -> PartitionState | None:
        """The partition as etcd holds it now (after a lost CAS the cache may still be
        behind the watch), cached as the watch would; None when it does not exist."""
        kv = await self.etcd.get(self.keys.partition(topic, partition))
        if kv is None:
            return None
        self._apply(kv, deleted=False, notify=True)
        return self._shown(decode_partition(topic, partition, kv))

    async def read_partitions(self) -> list[PartitionState]:
        """Every partition as etcd holds it now (before start() has loaded anything)."""
        kvs, _ = await self.etcd.get_prefix(self.keys.partitions)
        out = []
        for kv in kvs:
            topic, _, index = kv.key[len(self.keys.partitions):].rpartition("/")
            out.append(decode_partition(topic, int(index), kv))
        return out

    async def create_topic(self, name: str, assignment: list[tuple[int, ...]], configs: dict[str, str]) -> KafkaError:
        return await self.catalogue.create(name, assignment, configs)

    async def delete_topic(self, name: str, topic_id: str | None = None) -> KafkaError:
        return await self.catalogue.delete(name, topic_id)

    async def add_partitions(self, name: str, decide: GrowthDecision) -> tuple[KafkaError, str]:
        return await self.catalogue.grow(name, decide)

    async def _reload_topic(self, name: str) -> None:
        kv = await self.etcd.get(self.keys.topic(name))
        if kv is not None:
            self._apply(kv, deleted=False, notify=True)
        kvs, _ = await self.etcd.get_prefix(self.keys.partitions + name + "/")
        for kv in kvs:
            self._apply(kv, deleted=False, notify=True)
        self._changed()

    async def try_become_controller(self) -> bool:
        """Take the controller seat if vacant, bound to this broker's lease."""
        body = json.dumps({"node_id": self.node_id}).encode()
        ok, _ = await self.etcd.txn([mod_equals(self.keys.controller, 0)],
                                    [put_op(self.keys.controller, body, self.lease)])
        if ok:
            self._controller = self.node_id
        return ok


"""The share coordinator (KIP-932): share groups on the coordinator runtime.

Its shard is `ShareState` (share_state.py, plain Python); this module is the thin
asynchronous edge around it: the runtime's lifecycle (the seat loads it from its
internal topic, `__share_group_state`, by replaying every record), and the write path.
An operation decides synchronously against memory (so two fetches never acquire one
record), and its answer waits until the records that make it durable are committed
(runtime.log: appended now, fsynced, past the high watermark). Memory leads the log by
the writes in flight, as the transaction coordinator's does; a restart rebuilds it
from what was committed.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable, Mapping

from ..clock import mono_ms
from ..protocol.errors import KafkaError
from ..storage.log import PartitionLog
from .coordinator_log import done_future
from .ports import CoordinatorSeat, PartitionWriter
from .runtime import CoordinatorRuntime
from .share_locks import LockTimers
from .share_partition import SharePartition
from .share_state import GROUP_CONFIGS, HeartbeatAnswer, Pair, ShareState, check_group_config

log = logging.getLogger("semel.coordinator.share")

SHARE_TOPIC = "__share_group_state"
# Records per batch of a compaction rewrite.
REWRITE_BATCH = 500


class ShareCoordinator:
    """Every share group of this broker. `writer` waits for a record's commit point
    (None: at once, for tests), `clock` gives the milliseconds locks and sessions run on."""

    # A single node knows every member; a cluster's partition leaders do not
    # (share_leaders.LeaderShareCoordinator).
    members_here = True

    def __init__(self, writer: PartitionWriter | None, *, seat: CoordinatorSeat,
                 clock: Callable[[], int] | None = None, compact_records: int = 20_000,
                 compact_interval_s: float = 30) -> None:
        self.clock = clock or mono_ms
        self.runtime = CoordinatorRuntime(SHARE_TOPIC, writer, timer_clock=self.clock)
        self.state = ShareState()
        self.locks = LockTimers(self.runtime.timers, self.state, self.runtime.serving, self._locks_expired)
        self.seat = seat
        # Every acknowledgement writes its share-partition's state: the log is rewritten
        # (compacted) once it holds this many records, and 4x the live ones.
        self.compact_records = compact_records
        self.compact_interval_s = compact_interval_s

    @staticmethod
    def log_configs(segment_bytes: int = 64 << 20) -> dict[str, str]:
        # Share-partition state must never age out: the newest record of a key is the state.
        return {"cleanup.policy": "compact", "retention.ms": "-1", "retention.bytes": "-1",
                "segment.bytes": str(segment_bytes)}

    # --- lifecycle (the seat calls load, serve, unload) ---------------------------------

    async def start(self) -> None:
        self.runtime.start(run_timers=True)
        self.runtime.every(self.compact_interval_s, "compact", self.maybe_compact)

    def start_seat(self) -> None:
        self.seat.start(self)

    def load(self, plog: PartitionLog, epoch: int | None) -> None:
        self.runtime.load(self.state, plog, epoch)
        log.info("loaded %d share-partition(s) of %d share group config(s)",
                 len(self.state.partitions), len(self.state.configs))

    def serve(self, epoch: int | None) -> None:
        self.runtime.serve()

    def unload(self) -> None:
        self.runtime.unload(cancel_tasks=False)
        self.locks.cancel_all()
        self.state.clear()

    async def stop(self) -> None:
        await self.seat.stop()
        await self.runtime.stop(cancel_tasks=False)
        self.state.clear()

    def error(self) -> KafkaError:
        return self.runtime.error()

    # --- the write path -------------------------------------------------------------------

    def persist(self, pairs: list[Pair]) -> "asyncio.Future[KafkaError]":
        """Make `pairs` durable; the future says NONE once committed, or why not."""
        if not pairs:
            return done_future(KafkaError.NONE)
        clog = self.runtime.log
        return clog.write(lambda: clog.append_records(pairs), lambda info: KafkaError.NONE, lambda err: err)

    def _locks_expired(self, group_id: str, topic: str, p: int) -> None:
        """A lock timer released records: write the share-partition's state."""
        written = self.persist(self.partition_records(group_id, [(topic, p)]))

        async def wait() -> None:
            await written
        self.runtime.spawn(wait())

    async def maybe_compact(self) -> None:
        await self.compact()

    async def compact(self) -> bool:
        """Compaction by rewrite: append every live record as it stands, then drop the
        segments before it, so a load replays the state, not its history. Only at a
        quiet moment (no write in flight); True when it rewrote."""
        clog = self.runtime.log
        pairs = self.state.snapshot()
        if clog.inflight or clog.records_since_compaction < max(self.compact_records, 4 * len(pairs)):
            return False
        data = b"".join(clog.batch(pairs[i:i + REWRITE_BATCH]) for i in range(0, len(pairs), REWRITE_BATCH))
        return await clog.rewrite(data, len(pairs))

    def partition_records(self, group_id: str, keys: Iterable[tuple[str, int]]) -> list[Pair]:
        return [self.state.partition_record(group_id, t, p) for t, p in sorted(set(keys))
                if self.state.partition(group_id, t, p) is not None]

    async def prepare(self, group_id: str, led: dict[tuple[str, int], int]) -> dict[tuple[str, int], KafkaError]:
        """Share-partitions to read before a request uses them: none here, the whole
        state was loaded with the log."""
        return {}

    async def refresh_configs(self, group_id: str) -> None:
        """The configs are this broker's own: nothing to refresh."""

    def drop_topics(self, names: Iterable[str]) -> "asyncio.Future[KafkaError]":
        """This node deleted these topics: every share group's partitions of them go,
        tombstoned in the log, so a topic created again under a name is read from its own
        start, after a restart too."""
        gone = set(names)
        groups = sorted({g for g, t, _ in self.state.partitions if t in gone})
        return self.persist([pair for g in groups for t in sorted(gone) for pair in self.state.drop_topic(g, t)])

    def forget_topics(self, names: set[str]) -> None:
        """A cluster deleted these topics: their share-partitions held here go (the
        cluster's store dropped them with the topic). A single node's deletions do not
        come this way."""
        for spk in [k for k in self.state.partitions if k[1] in names]:
            del self.state.partitions[spk]

    # --- requests --------------------------------------------------------------------------

    def heartbeat(self, group_id: str, member_id: str, epoch: int, topics: tuple[str, ...] | None,
                  rack_id: str | None, partition_counts: Mapping[str, int],
                  client: tuple[str, str] = ("", "")) -> HeartbeatAnswer:
        err = self.error()
        if err:
            return HeartbeatAnswer(err, member_id, -1, None, 0)
        return self.state.heartbeat(group_id, member_id, epoch, topics, rack_id, partition_counts, self.clock(),
                                    client)

    async def alter_configs(self, group_id: str, wanted: Mapping[str, str],
                            validate_only: bool) -> tuple[KafkaError, str | None]:
        """The group's config overrides become `wanted`; all or nothing."""
        err = self.error()
        if err:
            return err, None
        for name, value in wanted.items():
            why = check_group_config(name, value)
            if why is not None:
                return KafkaError.INVALID_CONFIG, why
        if validate_only:
            return KafkaError.NONE, None
        return await self.persist(self.state.set_configs(group_id, wanted)), None

    def group_config_values(self, group_id: str) -> dict[str, tuple[str, bool]]:
        """name -> (value, set by the user) of every group config."""
        own = self.state.configs.get(group_id, {})
        return {name: (own.get(name, default), name in own) for name, (default, _, _) in GROUP_CONFIGS.items()}

    def share_partition(self, group_id: str, topic: str, p: int, reset_start: Callable[[str], int]
                        ) -> SharePartition:
        """The share-partition, started at `reset_start(share.auto.offset.reset)` the
        first time the group reads it."""
        sp = self.state.partition(group_id, topic, p)
        if sp is None:
            sp = self.state.init_partition(group_id, topic, p,
                                           reset_start(self.state.config(group_id, "share.auto.offset.reset")))
        return sp

    async def delete_group(self, group_id: str) -> KafkaError:
        """DeleteGroups of a share group: refused while it has members."""
        group = self.state.groups.get(group_id)
        if group is not None and group.members:
            return KafkaError.NON_EMPTY_GROUP
        return await self.persist(self.state.drop_group(group_id))

    def list_rows(self) -> list[tuple[str, str]]:
        """(group id, state) of every share group, for ListGroups."""
        return [(g, "Stable" if self.state.groups.get(g) and self.state.groups[g].members else "Empty")
                for g in self.groups()]

    def is_share_group(self, group_id: str) -> bool:
        return group_id in self.state.groups or group_id in self.state.configs or any(
            g == group_id for g, _, _ in self.state.partitions)

    def groups(self) -> list[str]:
        return sorted(set(self.state.groups) | {g for g, _, _ in self.state.partitions})

    def describe(self, group_id: str) -> dict[str, Any]:
        """Members and per-partition counts (the CLI and the metrics read this)."""
        group = self.state.groups.get(group_id)
        return {
            "group_id": group_id,
            "epoch": group.epoch if group else 0,
            "members": sorted(group.members) if group else [],
            "partitions": [{"topic": t, "partition": p, "start_offset": sp.start, **sp.counts()}
                           for t, p, sp in self.state.group_partitions(group_id)],
        }

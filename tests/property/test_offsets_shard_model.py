"""Committed offsets as a shard, driven directly with no event loop: Hypothesis picks
plain commits, transactional commits, their COMMIT/ABORT markers, OffsetDelete and the
tombstones of deleted topics. Each op of semel.coordinator.offsets_shard is appended to
an in-memory log and replayed into the live store at the positions the append gave it.

After every step the runtime's load of that log into a fresh store (the restart) holds
the same committed and pending offsets as the live store, and the committed offsets are
what a model of the log says: the last plain value or committed transactional value of
each partition, dropped by a later tombstone."""
from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "coordinator"))
from test_group_support import MemLog  # noqa: E402
from semel.coordinator import offsets_shard as shard  # noqa: E402
from semel.coordinator.group_replay import GroupStore  # noqa: E402
from semel.coordinator.offsets import CommittedOffset  # noqa: E402
from semel.coordinator.runtime import CoordinatorRuntime  # noqa: E402
from semel.protocol import records as rb  # noqa: E402
from semel.protocol.errors import KafkaError  # noqa: E402

GROUPS = ["g", "h"]
TPS = [("t", 0), ("t", 1), ("u", 0)]
PRODUCERS = [7, 8]
offsets = st.dictionaries(st.sampled_from(TPS), st.integers(0, 1000), min_size=1, max_size=3)


def _state(store: GroupStore) -> dict:
    return {g.group_id: ({tp: (v.offset, v.log_offset) for tp, v in g.offsets.committed.items()},
                         {p: {tp: (v.offset, v.log_offset) for tp, v in vs.items()}
                          for p, vs in g.offsets.pending.items()})
            for g in store.groups.values() if not g.offsets.is_empty()}


class OffsetsShardModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000
        self.store = GroupStore(lambda: self.now)
        self.plog = MemLog()
        # The model: committed offsets, and each producer's open offsets, as the log says:
        # key -> (offset, when it was written).
        self.committed: dict[tuple[str, tuple[str, int]], tuple[int, int]] = {}
        self.open: dict[int, dict[tuple[str, tuple[str, int]], tuple[int, int]]] = {}
        self.seq = 0

    def write(self, op: shard.OffsetOp) -> None:
        self.seq += 1
        if not op.records:
            return
        data = rb.build_batch(op.pairs(), producer_id=op.producer_id, producer_epoch=0 if op.producer_id >= 0 else -1,
                              base_sequence=rb.NO_SEQUENCE, transactional=op.producer_id >= 0)
        info = self.plog.append(data, rb.split_batches(data)[0])
        shard.replay(self.store, op, info.first_offset)

    @rule(group=st.sampled_from(GROUPS), values=offsets, big=st.booleans())
    def commit(self, group: str, values: dict, big: bool) -> None:
        self.now += 1
        metadata = "x" * 20 if big else ""
        op = shard.commit(group, {tp: (o, -1, metadata) for tp, o in values.items()}, now=self.now,
                          max_metadata_bytes=10)
        assert set(op.response.values()) == {KafkaError.OFFSET_METADATA_TOO_LARGE if big else KafkaError.NONE}
        self.write(op)
        if not big:
            for tp, o in values.items():
                self.committed[(group, tp)] = (o, self.seq)

    @rule(producer=st.sampled_from(PRODUCERS), group=st.sampled_from(GROUPS), values=offsets)
    def txn_commit(self, producer: int, group: str, values: dict) -> None:
        self.now += 1
        self.write(shard.commit(group, {tp: CommittedOffset(o, -1, None) for tp, o in values.items()},
                                now=self.now, max_metadata_bytes=10, producer_id=producer, producer_epoch=0))
        for tp, o in values.items():
            self.open.setdefault(producer, {})[(group, tp)] = (o, self.seq)

    @rule(producer=st.sampled_from(PRODUCERS), commit=st.booleans())
    def marker(self, producer: int, commit: bool) -> None:
        self.plog.append_control(rb.CONTROL_COMMIT if commit else rb.CONTROL_ABORT, producer, 0, 0)
        self.store.apply_marker(producer, commit)
        for key, (o, at) in self.open.pop(producer, {}).items():
            # A transactional value older in the log than a plain commit loses to it.
            if commit and (key not in self.committed or self.committed[key][1] < at):
                self.committed[key] = (o, at)

    @rule(group=st.sampled_from(GROUPS), tps=st.lists(st.sampled_from(TPS), min_size=1, max_size=3, unique=True))
    def delete(self, group: str, tps: list) -> None:
        op = shard.delete(self.store, group, tps, lambda metadata: set())
        err, results = op.response
        if group not in self.store.groups:
            assert err == KafkaError.GROUP_ID_NOT_FOUND
        self.write(op)
        if not err:
            assert set(results) == set(tps)
            for tp in tps:
                # A tombstone only for a committed offset; it drops the open values
                # written before it too, so a later COMMIT marker cannot bring one back.
                if self.committed.pop((group, tp), None) is not None:
                    for values_of in self.open.values():
                        values_of.pop((group, tp), None)
            self.open = {p: v for p, v in self.open.items() if v}

    @rule(topic=st.sampled_from(["t", "u"]))
    def drop_topic(self, topic: str) -> None:
        for op in shard.drop_topics(self.store, [topic], limit=2):
            self.write(op)
        for key in [k for k in self.committed if k[1][0] == topic]:
            del self.committed[key]
        for values_of in self.open.values():
            for key in [k for k in values_of if k[1][0] == topic]:
                del values_of[key]
        self.open = {p: v for p, v in self.open.items() if v}

    @invariant()
    def a_restart_loads_the_live_state(self) -> None:
        fresh = GroupStore(lambda: self.now)
        CoordinatorRuntime("__consumer_offsets", None).load(fresh, self.plog, None)
        assert _state(fresh) == _state(self.store)

    @invariant()
    def committed_is_what_the_log_says(self) -> None:
        live = {(g, tp): v.offset for g, group in self.store.groups.items()
                for tp, v in group.offsets.committed.items()}
        assert live == {k: o for k, (o, _) in self.committed.items()}
        pending = {p: {(g, tp): v.offset for g, group in self.store.groups.items()
                       for tp, v in group.offsets.pending.get(p, {}).items()} for p in PRODUCERS}
        assert pending == {p: {k: o for k, (o, _) in self.open.get(p, {}).items()} for p in PRODUCERS}


OffsetsShardModel.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
test_offsets_shard_model = OffsetsShardModel.TestCase

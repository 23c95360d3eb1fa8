"""The coordinators as shards, with no event loop: the runtime's load rebuilds each
shard's memory from its log alone, through the shard's `replay`, and the result is
the model's reading of the same records (the last word of every key; for offsets,
transactional values that count only once their COMMIT marker follows). Hypothesis
picks the records and how they are cut into batches."""
import sys
from pathlib import Path
from types import SimpleNamespace

from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "coordinator"))
from test_group_support import MemLog, MemLogs  # noqa: E402
from semel.broker.config import BrokerConfig  # noqa: E402
from semel.coordinator.group_replay import GroupStore  # noqa: E402
from semel.coordinator.offsets import CommittedOffset, offset_key, offset_value  # noqa: E402
from semel.coordinator.runtime import CoordinatorRuntime  # noqa: E402
from semel.coordinator.txn_states import TxnMeta, TxnState, encode_value  # noqa: E402
from semel.protocol import records as rb  # noqa: E402
from tests.support.coordinators import txn_coordinator  # noqa: E402

IDS = ["a", "b", "c"]


def _append(plog: MemLog, pairs, *, producer_id: int = -1) -> None:
    data = rb.build_batch(pairs, producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                          base_sequence=rb.NO_SEQUENCE, transactional=producer_id >= 0)
    plog.append(data, rb.split_batches(data)[0])


txn_op = st.tuples(st.sampled_from(IDS), st.sampled_from([*TxnState, None]), st.integers(0, 5))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(txn_op, min_size=1, max_size=4), max_size=12))
def test_the_txn_shard_loads_the_last_state_of_every_id(batches):
    plog, model = MemLog(), {}
    for batch in batches:
        pairs = []
        for txn_id, state, epoch in batch:
            if state is None:      # a tombstone: the id expired
                pairs.append((txn_id.encode(), None))
                model.pop(txn_id, None)
                continue
            parts = frozenset({("t", 0)}) if state != TxnState.EMPTY else None
            meta = TxnMeta(txn_id, 7, epoch, -1, -1, 60_000, state, parts, 1_000, 2_000)
            pairs.append((txn_id.encode(), encode_value(meta)))
            if state == TxnState.DEAD:
                model.pop(txn_id, None)
            else:
                model[txn_id] = (state, epoch)
        _append(plog, pairs)
    config = BrokerConfig(data_dir="/nonexistent")
    coord = txn_coordinator(MemLogs(), None, None, config, SimpleNamespace(coordinator_epoch=0))
    coord.load(plog, epoch=3)
    assert {t: (m.state, m.epoch) for t, m in coord.txns.items()} == model
    assert coord.coordinator_epoch == 3 and not coord.serving()


# (kind, group, partition, value): "commit" a plain offset, "delete" its tombstone,
# "txn" a transactional offset of producer 1, "commit-marker"/"abort-marker" its end.
offset_op = st.one_of(
    st.tuples(st.sampled_from(["commit", "delete", "txn"]), st.sampled_from(["g", "h"]), st.integers(0, 1),
              st.integers(0, 100)),
    st.tuples(st.sampled_from(["commit-marker", "abort-marker"]), st.just(""), st.just(0), st.just(0)))


@settings(max_examples=60, deadline=None)
@given(st.lists(offset_op, max_size=25))
def test_the_group_shard_loads_committed_offsets_as_the_log_says(ops):
    plog = MemLog()
    # (group, partition) -> (offset, position in the log): at a COMMIT marker a pending
    # value becomes committed only over an older plain commit (the later write wins).
    committed: dict[tuple[str, int], tuple[int, int]] = {}
    pending: dict[tuple[str, int], tuple[int, int]] = {}
    for at, (kind, group, partition, value) in enumerate(ops):
        key = offset_key(group, "t", partition)
        if kind == "commit":
            _append(plog, [(key, offset_value(CommittedOffset(value)))])
            committed[(group, partition)] = (value, at)
        elif kind == "delete":
            _append(plog, [(key, None)])
            committed.pop((group, partition), None)
            pending.pop((group, partition), None)
        elif kind == "txn":
            _append(plog, [(key, offset_value(CommittedOffset(value)))], producer_id=1)
            pending[(group, partition)] = (value, at)
        else:
            commit = kind == "commit-marker"
            data = rb.build_control_batch(rb.CONTROL_COMMIT if commit else rb.CONTROL_ABORT,
                                          producer_id=1, producer_epoch=0, coordinator_epoch=0)
            plog.append(data, [(0, rb.parse_header(data))])
            if commit:
                for gp, (v, pos) in pending.items():
                    if gp not in committed or committed[gp][1] < pos:
                        committed[gp] = (v, pos)
            pending.clear()
    store = CoordinatorRuntime("__consumer_offsets", None)
    shard = GroupStore(lambda: 0)
    store.load(shard, plog, None)
    got = {(g, tp[1]): v.offset for g, group in shard.groups.items() for tp, v in group.offsets.committed.items()}
    assert got == {gp: v for gp, (v, _) in committed.items()}
    waiting = {(g, tp[1]): v.offset for g, group in shard.groups.items()
               for values in group.offsets.pending.values() for tp, v in values.items()}
    assert waiting == {gp: v for gp, (v, _) in pending.items()}

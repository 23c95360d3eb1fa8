"""A 3-broker cluster (RF 3, min.insync.replicas 2, acks=all) whose brokers and etcd keep
their data on power-cut disks (semel.launch.lazyfs): what was not fsynced is gone when
the power goes. Under an idempotent acks=all producer and a transactional copier
(tests/support/cluster_power.py), the power of the whole cluster is cut at random moments,
and of single brokers in between: every acknowledged record survives exactly once
(producer state too: no retry doubles a record), and the copy is exact (committed
transactions and committed offsets survived). Each cut is followed by a restart of
whatever lost power, in a random order, which must always succeed."""
from __future__ import annotations

import pytest

from tests.support.powercut import require_fuse
from tests.support.cluster_power import WHOLE, power_cut_cluster, run_power_cuts

pytestmark = pytest.mark.process

BROKER_ARGS = ("--group-initial-rebalance-delay-ms", "0", "--replica-lag-time-max-ms", "4000",
               "--replica-fetch-wait-max-ms", "100")


@pytest.fixture(scope="module")
def pc(tmp_path_factory):
    require_fuse()
    with power_cut_cluster(tmp_path_factory.mktemp("power"), *BROKER_ARGS) as pc:
        yield pc


@pytest.mark.timeout(600)    # each whole-cluster cut: etcd and three brokers restart, elect, and clients reconnect
def test_power_cuts_of_the_whole_cluster_lose_no_acknowledged_record(pc):
    out = run_power_cuts(pc, [WHOLE, 1, WHOLE, 2], seed=7, copy_records=1000)
    assert out.failed == [], out.failed[:5]
    acked = sorted(v.decode() for v in out.acked)
    missing = sorted(set(acked) - set(out.data_values))
    assert not missing, f"{len(missing)} acknowledged records lost ({out.cuts}): {missing[:10]}"
    assert sorted(out.data_values) == acked            # and none twice
    assert sorted(out.copied) == sorted(out.input_values), (out.cuts, out.copier_failures[-5:])

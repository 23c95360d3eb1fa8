"""Share groups on a 3-broker cluster whose brokers and etcd keep their data on power-cut
disks (semel.launch.lazyfs: what was not fsynced is gone when the power goes): after the
power of the whole cluster is cut in the middle of consumption, the records a
ShareConsumer acknowledged are never delivered again, and every other record is
delivered (those it held unacknowledged a second time)."""
from __future__ import annotations

import random

import pytest

from tests.cluster.test_power_loss import BROKER_ARGS as POWER_LOSS_ARGS
from tests.cluster.test_share_groups_cluster import create_and_fill
from tests.support.cluster import leader_of, wait_brokers
from tests.support.cluster_power import power_cut_cluster
from tests.support.powercut import require_fuse
from tests.support.share import accept_some_then, names, read_all, set_group_configs

pytestmark = pytest.mark.process

BROKER_ARGS = (*POWER_LOSS_ARGS, "--min-insync-replicas", "2", "--offsets-topic-partitions", "1")


@pytest.fixture(scope="module")
def pc(tmp_path_factory):
    require_fuse()
    with power_cut_cluster(tmp_path_factory.mktemp("share-power"), *BROKER_ARGS) as pc:
        yield pc


@pytest.mark.timeout(600)
def test_a_power_cut_of_the_whole_cluster_keeps_what_was_acknowledged(pc):
    cluster = pc.cluster
    topic, group = names("power")
    values = create_and_fill(cluster, topic, 1, 30)
    set_group_configs(cluster.bootstrap, group, share_auto_offset_reset="earliest")
    accepted_pairs, held_pairs = accept_some_then(cluster.bootstrap, group, topic, 15,
                                                  lambda: pc.cut_all(random.Random(45)))
    accepted, held = [v for _, v in accepted_pairs], [v for _, v in held_pairs]
    wait_brokers(cluster, {0, 1, 2})
    leader_of(cluster, topic)
    seen = read_all(cluster.bootstrap, group, topic, len(values) - len(accepted), quiet_s=4)
    got = [m.value().decode() for m in seen]
    assert len(accepted) == 15 and held
    assert sorted(got) == sorted(set(values) - set(accepted))
    counts = {m.value().decode(): m.delivery_count() for m in seen}
    assert all(counts[v] >= 2 for v in held)

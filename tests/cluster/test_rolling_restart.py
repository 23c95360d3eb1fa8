"""A rolling restart of all three brokers of a real cluster (etcd and broker processes),
each stopped with SIGTERM: its controlled shutdown hands every partition it leads, and
with the internal partitions its transaction and group coordinators, to in-sync peers
before it stops. Under an acks=all idempotent confluent-kafka producer and a
transactional copier (tests/support/rolling.py): no delivery fails, the copy is exact,
nothing acknowledged is lost or doubled. The longest produce stall is measured by
bench/rolling_restart.py, not asserted here."""
from __future__ import annotations

import pytest

from tests.support.cluster import module_cluster
from tests.support.rolling import rolling_restart
from tests.support.markers import starts_processes


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "rolling", 3, 2, "--group-initial-rebalance-delay-ms", "0",
                        "--replica-lag-time-max-ms", "2000", "--replica-fetch-wait-max-ms", "100") as c:
        yield c


def test_rolling_restart_loses_nothing_and_copies_exactly(cluster):
    out = rolling_restart(cluster)
    # Each broker handed everything over before it stopped (every topic has three in-sync
    # replicas, so nothing had to stay).
    for r in out.restarts:
        assert r["leaderships_handed_over"] > 0 and r["leaderships_kept"] == 0, out.restarts
    assert out.failed == []
    assert sorted(out.data_values) == sorted(v.decode() for v in out.acked)    # every ack, once
    assert out.copy_commits_before_last_restart < out.copy_commits             # copying throughout
    assert sorted(out.copied) == sorted(out.input_values), out.copier_failures[-5:]

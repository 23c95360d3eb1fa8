"""`semel check --cluster`: the Jepsen-style workload against a real 3-broker semel
cluster (etcd and three broker processes), RF3 topic with min.insync.replicas 2,
while the nemesis SIGKILLs partition leaders and followers and SIGSTOPs brokers past
their lease. Exactly-once must hold, so nothing may be found; and the nemesis must
really have taken leaders down and made the cluster elect new ones.

Seed 27's schedule (cluster faults only, so it is fixed by the seed): a leader kill
at about 1 s, a pause of 6 s (twice the lease) next, then a follower kill at about
17 s; the workload runs 28 s, so every kind is in (with room for slow restarts) (a fault under way at the end
completes before the heal).
"""
from __future__ import annotations

import json

import pytest

from tests.integration.check.check_run import explain, run_check

# The test body starts etcd and broker processes.
pytestmark = [pytest.mark.process, pytest.mark.timeout(240)]


def nemesis_events(out, f: str) -> list[tuple[dict, dict]]:
    """(invoke, completion note) pairs of nemesis episodes of kind f, in order."""
    events = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    ours = [e for e in events if e.get("process") == "nemesis" and e.get("f") == f]
    invokes = [e for e in ours if e["type"] == "invoke"]
    notes = [e for e in ours if e["type"] == "info"]
    assert len(invokes) == len(notes), ours
    return list(zip(invokes, notes))


def test_semel_cluster_passes_check_under_leader_kills_and_pauses(tmp_path):
    out = tmp_path / "out"
    proc, summary = run_check(out, "--cluster", "--nodes", "3", "--duration", "28", "--seed", "27",
                              "--faults", "leader-kill,follower-kill,broker-pause", "--fault-interval", "1", "3",
                              "--no-plot", timeout_s=200)
    assert summary, explain(proc)
    cluster = summary["run"]["cluster"]
    faults = summary["stats"]["faults"]
    assert faults.get("kill-leader", 0) >= 1 and faults.get("pause-broker", 0) >= 1, explain(proc)
    assert faults.get("kill-follower", 0) >= 1, explain(proc)

    kills = nemesis_events(out, "kill-leader")
    for invoke, done in kills:
        v, n = invoke["value"], done["value"]
        # the victim led the partition it was picked for, and is not a coordinator's broker
        assert v["partition"] in v["leads"] and v["node"] not in v["coordinators"]
        # the cluster settled (leaders, full ISRs) and elected: every partition the victim
        # led has a newer leader epoch
        assert n["settled"] is True, done
        assert all(n["epochs"][str(p)] > v["epochs"][str(p)] for p in v["leads"]), (invoke, done)
    for invoke, done in nemesis_events(out, "pause-broker"):
        assert invoke["value"]["node"] not in invoke["value"]["coordinators"] and done["value"]["settled"] is True
    assert sum(cluster["epochs_end"].values()) > sum(cluster["epochs_start"].values())

    ops = summary["stats"]["ops"]
    assert ops.get("txn:ok", 0) > 20 and ops.get("txn:fail", 0) > 3, explain(proc)
    assert summary["stats"]["reads_read_committed"] > 0 and summary["stats"]["reads_read_uncommitted"] > 0
    assert summary["valid"] is True, explain(proc)
    assert proc.returncode == 0 and "VALID: no anomaly found" in proc.stdout, explain(proc)


def test_semel_cluster_passes_check_under_power_cuts_disk_errors_clock_steps_and_partitions(tmp_path):
    """The nemeses beyond a crash: power cuts of one broker or the whole cluster with etcd
    (power-cut disks), a broker's disk failing with EIO for seconds, a broker's wall clock
    stepped an hour, a broker's packets to its peers dropped (network namespaces). Seed
    151's schedule (cluster faults only, so fixed by the seed): a power cut of the whole
    cluster, a failing disk, a clock step, then a one-way cut at about 22 s, inside the
    workload's 34 s (room for slow restarts after the power cut)."""
    from semel.launch.netns import available
    from tests.support.powercut import in_ci, require_fuse
    require_fuse()
    why = available()
    if why is not None:
        if in_ci():
            pytest.fail(f"network namespaces are required in CI: {why}")
        pytest.skip(f"no network namespaces: {why}")
    out = tmp_path / "out"
    proc, summary = run_check(out, "--cluster", "--nodes", "3", "--duration", "34", "--seed", "151",
                              "--faults", "power-loss,disk,clock,partition", "--fault-interval", "1", "2",
                              "--no-plot", timeout_s=230)
    assert summary, explain(proc)
    faults = summary["stats"]["faults"]
    assert {"power-loss", "disk", "clock", "partition"} <= set(faults), (faults, explain(proc))
    for f in ("power-loss", "disk", "clock", "partition"):
        for invoke, done in nemesis_events(out, f):
            assert done["value"]["settled"] is True, (invoke, done)
    cuts = [invoke["value"] for invoke, _ in nemesis_events(out, "power-loss")]
    assert cuts and cuts[0]["whole_cluster"] is True, cuts
    assert summary["stats"]["ops"].get("txn:ok", 0) > 20, explain(proc)
    assert summary["valid"] is True, explain(proc)
    assert proc.returncode == 0 and "VALID: no anomaly found" in proc.stdout, explain(proc)

"""`semel cluster start`, `semel topic create --replication-factor` and `semel topic
describe` as a user runs them: real processes, a clean stop on SIGTERM, one line on bad input."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.integration.test_cli import semel

pytestmark = pytest.mark.process   # each test runs `semel cluster start` as a process


def _one_line(r) -> str:
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def _listening(hostport: str) -> bool:
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def test_cluster_start_serves_topics_and_stops_cleanly(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "semel", "cluster", "start", "--nodes", "2", "--data-dir",
                             str(tmp_path), "--base-port", "0", "--etcd-port", "0", "--lease-ttl-s", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stdout:          # ends (EOF) if the command dies before it is up
            lines.append(line)
            if line.startswith("bootstrap: "):
                break
        assert lines and lines[-1].startswith("bootstrap: "), "".join(lines) + proc.stderr.read()
        bootstrap = lines[-1].split(" ", 1)[1].strip()
        etcd = lines[0].split()[2]
        assert lines[-2].startswith("topics: replication factor 2, min.insync.replicas 1"), lines
        assert len(bootstrap.split(",")) == 2 and all(_listening(hp) for hp in [etcd, *bootstrap.split(",")])
        b = ["--bootstrap", bootstrap.split(",")[1]]
        r = semel("topic", "create", "cli-rf2", "--partitions", "2", "--replication-factor", "2", *b)
        assert r.returncode == 0 and "replication factor 2" in r.stdout, r.stderr
        assert "--replication-factor" in _one_line(semel("topic", "create", "x", "--replication-factor", "0", *b))
        assert "INVALID_REPLICATION_FACTOR" in _one_line(
            semel("topic", "create", "cli-rf3", "--replication-factor", "3", *b))
        desc = semel("topic", "describe", "cli-rf2", *b)
        assert desc.returncode == 0, desc.stderr
        rows = [ln.split("\t") for ln in desc.stdout.splitlines()[2:]]
        assert desc.stdout.splitlines()[1].split("\t")[4:] == ["leader", "epoch", "replicas", "isr"]
        assert sorted(row[4] for row in rows) == ["0", "1"]          # one leader on each broker
        assert all(sorted(row[6].split(",")) == ["0", "1"] and row[5] == "0" for row in rows)
        # no --replication-factor: the cluster's default, replicated on both brokers
        r = semel("topic", "create", "cli-default", "--partitions", "2", *b)
        assert r.returncode == 0 and "2 partition(s), replication factor 2" in r.stdout, r.stderr
        desc = semel("topic", "describe", "cli-default", *b)
        assert desc.returncode == 0, desc.stderr
        assert [sorted(ln.split("\t")[6].split(",")) for ln in desc.stdout.splitlines()[2:]] == [["0", "1"]] * 2
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    assert "cluster stopped" in out
    assert not any(_listening(hp) for hp in [etcd, *bootstrap.split(",")])


@pytest.mark.parametrize("nodes, broker_args, flags, rf, min_isr", [
    (1, [], ["--default-replication-factor", "1", "--min-insync-replicas", "1"], 1, 1),
    (3, [], ["--default-replication-factor", "3", "--min-insync-replicas", "2"], 3, 2),
    (5, [], ["--default-replication-factor", "3", "--min-insync-replicas", "2"], 3, 2),
    (3, ["--default-replication-factor=1"], ["--min-insync-replicas", "1"], 1, 1),
    (3, ["--min-insync-replicas", "3"], ["--default-replication-factor", "3"], 3, 3),
])
def test_cluster_start_replicates_topics_by_default(nodes, broker_args, flags, rf, min_isr):
    """The brokers' flags `semel cluster start` adds and the line it prints; the user's
    own --broker-arg wins."""
    from semel.cli.cluster import replicated_defaults
    got, line = replicated_defaults(nodes, broker_args)
    assert got == flags
    assert line.startswith(f"topics: replication factor {rf}, min.insync.replicas {min_isr} ")


def test_bad_cluster_input_is_one_readable_line(tmp_path):
    assert "--nodes" in _one_line(semel("cluster", "start", "--nodes", "0", "--data-dir", str(tmp_path)))
    assert "metadata endpoint" in _one_line(
        semel("broker", "start", "--data-dir", str(tmp_path / "b"), "--metadata", "no port here"))
    r = semel("broker", "start", "--data-dir", str(tmp_path / "b"), "--port", "0", "--metadata", "127.0.0.1:1")
    last = r.stderr.strip().splitlines()[-1]     # the broker's log line, then the command's one line
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert last.startswith("semel broker: cannot start: no etcd endpoint answered"), r.stderr


def test_cluster_start_saves_the_inter_broker_user_before_any_broker(tmp_path, monkeypatch):
    """--inter-broker-user's login is in etcd before the first broker starts (brokers
    log in to each other with it from their first fetch)."""
    from functools import partial

    from semel.broker.auth.cluster_store import save_users
    from semel.cli.cluster import _inter_broker, _start
    from semel.launch.local_cluster import LocalCluster
    monkeypatch.setenv("IB_PW", "ib-secret")
    args = SimpleNamespace(inter_broker_user="broker", inter_broker_password_env="IB_PW")
    _, users = _inter_broker(args)
    cluster = LocalCluster(tmp_path, 0, prepare=partial(save_users, users=users))
    try:
        _start(cluster)
        listed = semel("user", "list", "--metadata", cluster.etcd.bootstrap)
        assert listed.returncode == 0 and listed.stdout.split("\t")[0] == "broker", listed
    finally:
        cluster.stop()
        cluster.close()

"""`semel check` must be able to fail: Tansu lets read_committed consumers see
records of aborted transactions, and loses everything when killed."""
from __future__ import annotations

import json

import pytest

from semel.launch.process import tansu_binary

from check_run import TANSU_TEMPLATE, explain, run_check

pytestmark = pytest.mark.timeout(300)


def test_tansu_aborted_reads_are_reported(tansu, tmp_path):
    out = tmp_path / "out"
    # Seed 5's schedule: client kills at about 3.5 and 7.5 s, so 12 s holds two faults.
    proc, summary = run_check(out, "--bootstrap", tansu.bootstrap, "--duration", "12", "--seed", "5",
                              "--faults", "client-kill,client-pause", "--fault-interval", "3", "5")
    assert proc.returncode == 1, explain(proc)
    assert summary["valid"] is False
    aborted = summary["anomaly_counts"]["aborted-read"]
    assert aborted > 0, explain(proc)
    # Every reported case really is a read_committed read of an aborted transaction.
    for case in summary["anomalies"]["aborted-read"]:
        assert case["writer"]["type"] == "fail" and case["writer"]["f"] == "txn"
    assert "aborted-read (" in proc.stdout and "INVALID" in proc.stdout
    # The workload did what it says: commits and aborts, reads at both isolations, faults.
    ops = summary["stats"]["ops"]
    assert ops.get("txn:ok", 0) > 20 and ops.get("txn:fail", 0) > 5
    assert summary["stats"]["reads_read_committed"] > 0 and summary["stats"]["reads_read_uncommitted"] > 0
    assert sum(summary["stats"]["faults"].values()) >= 2
    assert (out / "offsets.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "report.txt").read_text().startswith("semel check: INVALID")
    history = (out / "history.jsonl").read_text().splitlines()
    assert len(history) > 100 and all(json.loads(line)["index"] == i for i, line in enumerate(history))


def test_tansu_broker_kills_lose_data_and_check_sees_it(tmp_path):
    out = tmp_path / "out"
    template = TANSU_TEMPLATE.format(tansu=tansu_binary())
    # Seed 3's schedule: broker kills at about 4.6 and 8.9 s, so 14 s holds two.
    proc, summary = run_check(out, "--broker-cmd", template, "--duration", "14", "--seed", "3",
                              "--faults", "broker-kill", "--fault-interval", "4", "6")
    assert proc.returncode == 1, explain(proc)
    assert summary["stats"]["faults"].get("kill-broker", 0) >= 2
    counts = summary["anomaly_counts"]
    # Memory storage forgets the log on restart: offsets get reused and records vanish.
    assert counts["inconsistent-offsets"] + counts["lost-write"] + counts["unseen"] > 0, explain(proc)

"""`semel check` in CI mode against semel's own broker, SIGKILLed and restarted
by check: exactly-once must hold, so nothing may be found."""
from __future__ import annotations

import pytest

from check_run import explain, run_check

pytestmark = [pytest.mark.timeout(330), pytest.mark.slow]


def test_semel_passes_check_under_broker_sigkills(tmp_path):
    out = tmp_path / "out"
    # Seed 11's schedule: a client kill and a pause, then broker kills from about 14 s;
    # the third ends by about 28 s (40 s leaves room for slow restarts on a loaded machine).
    proc, summary = run_check(out, "--spawn-semel", "--mode", "ci", "--seed", "11", "--duration", "40",
                              "--faults", "broker-kill,client-kill,client-pause", "--fault-interval", "3", "6",
                              timeout_s=300)
    assert summary, explain(proc)
    assert summary["stats"]["faults"].get("kill-broker", 0) >= 3, explain(proc)
    ops = summary["stats"]["ops"]
    assert ops.get("txn:ok", 0) > 50 and ops.get("txn:fail", 0) > 10, explain(proc)
    assert summary["stats"]["reads_read_committed"] > 0 and summary["stats"]["reads_read_uncommitted"] > 0
    assert summary["valid"] is True, explain(proc)
    assert proc.returncode == 0, explain(proc)

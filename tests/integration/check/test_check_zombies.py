"""`semel check` with zombie instances: three processes of one
transactional id started at one moment, round after round, against semel's own
broker. Each round the broker must fence all but the last to initialise; after
the fix nothing is found."""
from __future__ import annotations

import json

import pytest

from check_run import explain, run_check

pytestmark = [pytest.mark.timeout(200), pytest.mark.slow]


def test_zombie_instances_find_nothing_on_semel(tmp_path):
    out = tmp_path / "out"
    # A round lasts its 2.5 s start plus 1 to 4 s of transactions: the second round's
    # instances run from about 9 s, so 14 s holds two rounds.
    proc, summary = run_check(out, "--spawn-semel", "--mode", "ci", "--seed", "3", "--duration", "14",
                              "--faults", "none", "--zombies", "3", timeout_s=180)
    assert summary, explain(proc)
    assert summary["valid"] is True, explain(proc)
    assert proc.returncode == 0, explain(proc)
    zombie = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    zombie = [e for e in zombie if str(e.get("txn_id", "")).endswith("-zombie") and e["type"] != "invoke"]
    # The zombie slots did run: several incarnations, transactions committed by some.
    assert len({e["process"] for e in zombie}) >= 4, explain(proc)
    assert sum(e["type"] == "ok" for e in zombie) >= 5, explain(proc)


def test_one_zombie_instance_is_refused_in_one_line(tmp_path):
    proc, _ = run_check(tmp_path / "out", "--bootstrap", "127.0.0.1:1", "--zombies", "1", timeout_s=60)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, explain(proc)
    assert "zombie" in (proc.stdout + proc.stderr).lower(), explain(proc)

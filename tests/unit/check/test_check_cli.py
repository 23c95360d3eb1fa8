"""`semel check` as a command: exit status, outputs, and clear errors for bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from semel.check.history import from_events
from semel.check.workload import Workload, WorkloadConfig, WorkloadError
from semel.cli.main import main

from check_histbuilder import H


def write_history(path: Path, events: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def clean_events() -> list[dict]:
    h = H()
    h.txn(1, [(0, 10, 0), (1, 11, 0)])
    h.txn(1, [(0, 12, 2)], type="fail")
    h.poll(2, {0: [(0, 10)], 1: [(0, 11)]})
    return h.events


def test_analyze_clean_history_exits_zero_and_writes_outputs(tmp_path, capsys):
    hist = write_history(tmp_path / "history.jsonl", clean_events())
    assert main(["check", "--analyze", str(hist), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "VALID: no anomaly found" in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["valid"] is True and summary["anomaly_counts"]["aborted-read"] == 0
    assert "_facts" not in summary
    assert (tmp_path / "out" / "report.txt").read_text().startswith("semel check: VALID")
    png = (tmp_path / "out" / "offsets.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_analyze_history_with_anomaly_exits_one(tmp_path, capsys):
    events = clean_events()
    h = H()
    h.events = events
    h.t = 1000
    h.poll(3, {0: [(2, 12)]})  # the aborted value, at read_committed
    hist = write_history(tmp_path / "history.jsonl", h.events)
    assert main(["check", "--analyze", str(hist), "--no-plot"]) == 1
    out = capsys.readouterr().out
    assert "INVALID: aborted-read (1)" in out
    assert "key 0 offset 2 value 12" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["anomalies"]["aborted-read"][0]["value"] == 12
    assert not (tmp_path / "offsets.png").exists()


@pytest.mark.parametrize("content, message", [
    ("{not json\n", "history line 1: not JSON"),
    ('{"process": 1, "type": "ok", "f": "poll", "value": [["poll"]]}\n', "without an invocation"),
    ('{"process": 1, "type": "maybe", "f": "poll"}\n', "type must be one of"),
    ('{"process": 1, "type": "invoke", "f": "txn", "value": [["send", 0]]}\n'
     '{"process": 1, "type": "ok", "f": "txn", "value": [["send", 0]]}\n', "send must be"),
    ('{"process": 1, "type": "invoke", "f": "poll", "value": [["poll"]]}\n'
     '{"process": 1, "type": "ok", "f": "poll", "value": [["poll", {"0": [[1]]}]]}\n', "not [offset, value]"),
    ('{"process": 1, "type": "invoke", "f": "poll"}\n{"process": 1, "type": "invoke", "f": "poll"}\n',
     "before completing"),
])
def test_bad_history_is_a_clear_error_not_a_crash(tmp_path, capsys, content, message):
    hist = tmp_path / "history.jsonl"
    hist.write_text(content)
    assert main(["check", "--analyze", str(hist)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "summary.json").exists()  # nothing half-written


def test_missing_history_file(tmp_path, capsys):
    assert main(["check", "--analyze", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read history" in capsys.readouterr().err


def test_pending_op_at_end_counts_as_unknown():
    h = H()
    h.txn(1, [(0, 10, 0)])
    h.txn_begin(2, [(0, 20, None)])  # never completed: the process was lost
    hist = from_events(h.events)
    assert [op.type for op in hist.ops] == ["ok", "info"]


@pytest.mark.parametrize("argv, message", [
    (["check", "--bootstrap", "127.0.0.1:1", "--faults", "broker-kill"], "need --broker-cmd or --spawn-semel"),
    (["check", "--bootstrap", "127.0.0.1:1", "--faults", "meteor"], "unknown fault 'meteor'"),
    (["check", "--bootstrap", "127.0.0.1:1", "--duration", "600"], "at most --duration 60"),
    (["check", "--bootstrap", "nohostport"], "HOST:PORT"),
    (["check"], "say where the broker is"),
    (["check", "--broker-cmd", "tansu {nope}"], "use {port}, {data} and {host}"),
])
def test_usage_errors(tmp_path, capsys, argv, message):
    assert main(argv + ["--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err


def test_broker_faults_refused_without_a_managed_broker(tmp_path):
    with pytest.raises(WorkloadError, match="broker faults"):
        WorkloadConfig(bootstrap="127.0.0.1:1", out_dir=tmp_path, faults=("broker-kill",)).validate()


def _schedule(tmp_path: Path, seed: int, n: int = 30) -> list:
    wl = Workload(WorkloadConfig(bootstrap="127.0.0.1:1", out_dir=tmp_path, seed=seed))
    wl.workers.build_slots()
    try:
        out = []
        for slot in wl.workers.slots:
            for _ in range(n):
                cmd, _ = wl.next_op(slot)
                # Values come from one shared counter; the shape is what the seed decides.
                shape = {k: v for k, v in cmd.items() if k != "mops"}
                shape["mops"] = [m[:2] for m in cmd.get("mops", [])]
                out.append((slot.name, json.dumps(shape, sort_keys=True)))
        return out
    finally:
        wl.history.close()
        wl.worker_log.close()


def test_same_seed_same_schedule(tmp_path):
    a = _schedule(tmp_path / "a", seed=42)
    b = _schedule(tmp_path / "b", seed=42)
    c = _schedule(tmp_path / "c", seed=43)
    assert a == b
    assert a != c
    assert any('"decision": "abort"' in s for _, s in a) and any('"decision": "commit"' in s for _, s in a)


@pytest.mark.parametrize("xdg", [True, False], ids=["XDG_STATE_HOME", "home"])
@pytest.mark.process
def test_default_output_directory_is_outside_the_current_one(tmp_path, xdg):
    """Without --out a run writes under the user's state directory; the directory it
    was started in (a source tree, say) stays empty. The broker command fails at once,
    after the output directory was made, so the run stops there with a usage error."""
    import os
    import subprocess
    import sys
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "XDG_STATE_HOME"}
    env["HOME"] = str(home)
    state = home / ".local" / "state"
    if xdg:
        state = tmp_path / "state"
        env["XDG_STATE_HOME"] = str(state)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    out = subprocess.run([sys.executable, "-m", "semel", "check", "--broker-cmd", "false {port} {data}",
                          "--no-plot"], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "broker exited" in out.stderr
    assert list(work.iterdir()) == []
    runs = list((state / "semel" / "check").iterdir())
    assert len(runs) == 1 and (runs[0] / "broker.log").is_file()
    assert str(runs[0]) in out.stderr

"""semel beside the Kafka clients users already have: the ranges of pyproject.toml hold
at both ends. Two venvs (cached under .venv-compat/, git-ignored; rebuilt when
pyproject.toml changes, or by deleting the folder) install this checkout with

- oldest: every base dependency, confluent-kafka (the `clients` extra), kafka-python and
  aiokafka at the floor of its range;
- newest: the newest releases the ranges allow (`pip install --upgrade`);

and run tests/support/client_smoke.py in each: a broker from that venv, and a round
trip from confluent-kafka (with a committed and an aborted transaction), kafka-python,
aiokafka, and `semel produce` / `semel consume`. A third, `plain`, is `pip install semel`
without extras: its broker serves this test's confluent-kafka. No Spark in these venvs:
they stay small."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

pytestmark = [pytest.mark.process, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / ".venv-compat"
CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka")


def ranged_requirements() -> list[str]:
    """The base dependencies, the `clients` extra and aiokafka's range (from the spark extra)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return (project["dependencies"] + extras["clients"]
            + [r for r in extras["spark"] if r.startswith("aiokafka")])


def at_floor(requirement: str) -> str:
    """"name>=X,<Y; marker" -> "name==X; marker"."""
    spec, _, marker = requirement.partition(";")
    m = re.fullmatch(r"\s*([A-Za-z0-9_.\[\]-]+)\s*>=\s*([^,\s]+)\s*(,.*)?", spec)
    assert m, f"{requirement!r}: every range in pyproject.toml has a floor (>=)"
    return f"{m.group(1)}=={m.group(2)}" + (f";{marker}" if marker else "")


def floor_of(name: str) -> str:
    return next(at_floor(r).split(";")[0].split("==")[1] for r in ranged_requirements()
                if re.match(rf"{re.escape(name)}\s*>=", r))


def compat_python(name: str, pip_args: list[str], extras: str = "[clients]") -> Path:
    """The venv's python, built (once per pyproject.toml and pip_args) with this checkout
    installed editable, so it always runs the current source."""
    venv = COMPAT / name
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + repr((pip_args, extras)).encode()).hexdigest()
    python, stamp = venv / "bin" / "python", venv / ".semel-compat-stamp"
    if python.exists() and stamp.exists() and stamp.read_text() == key:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "-e", f"{ROOT}{extras}", *pip_args], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"pip install into {venv} failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
    stamp.write_text(key)
    return python


def smoke(python: Path) -> dict[str, str]:
    """Run the smoke in that venv; the client versions it ran with."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(python), str(ROOT / "tests" / "support" / "client_smoke.py")],
                       capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert r.returncode == 0, f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("smoke ok: "), r.stdout
    words = last.removeprefix("smoke ok: ").split()
    return dict(zip(words[::2], words[1::2]))


def test_oldest_client_versions_the_ranges_allow():
    pins = [at_floor(r) for r in ranged_requirements()]
    ran = smoke(compat_python("oldest", pins))
    assert {c: Version(v) for c, v in ran.items()} == {c: Version(floor_of(c)) for c in CLIENTS}


def test_newest_client_versions_the_ranges_allow():
    ran = smoke(compat_python("newest", ["--upgrade", *CLIENTS]))
    tested = dict(line.strip().split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                  if line.strip() and not line.startswith("#"))
    for client in CLIENTS:   # at least the exact set the suite runs on
        assert Version(ran[client]) >= Version(tested[client]), (client, ran[client])


def test_a_plain_install_runs_the_broker(tmp_path):
    """No extras: `semel broker start` serves an acks=all round trip (from this test's
    confluent-kafka), and `semel produce` names the extra it needs in one line."""
    from confluent_kafka import Consumer, Producer

    from semel.launch.process import free_port, wait_for_port
    python = compat_python("plain", [], extras="")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(python), "-c", "import confluent_kafka"], capture_output=True, env=env)
    assert r.returncode != 0   # the plain venv really has no client library
    r = subprocess.run([str(python), "-m", "semel", "produce", "t", "--value", "x"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 2 and "semel[clients]" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    port = free_port()
    with open(tmp_path / "broker.log", "wb") as log:
        broker = subprocess.Popen([str(python), "-m", "semel", "broker", "start", "--data-dir", str(tmp_path / "d"),
                                   "--port", str(port), "--auto-create-topics"], stdout=log, stderr=subprocess.STDOUT,
                                  env=env)
    try:
        wait_for_port("127.0.0.1", port, 60, broker)
        p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "acks": "all"})
        p.produce("plain", b"v")
        assert p.flush(30) == 0
        c = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "g", "auto.offset.reset": "earliest"})
        c.subscribe(["plain"])
        got = None
        for _ in range(60):
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got = m.value()
                break
        c.close()
        assert got == b"v"
    finally:
        broker.terminate()
        assert broker.wait(30) == 0, (tmp_path / "broker.log").read_text()[-2000:]

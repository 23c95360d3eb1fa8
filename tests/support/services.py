"""External services for the whole test session: a real PostgreSQL (pg_uri) and an
S3 server (s3_endpoint). Registered once in tests/conftest.py, so every directory
that uses them (tests/integration/eos, tests/chaos/eos, tests/spark) shares one
server of each per run (registered per directory, each conftest would get its own
session-scoped instance: up to three PostgreSQL servers a run)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.markers import starts_processes


@pytest.fixture(scope="session")
@starts_processes
def pg_uri(tmp_path_factory):
    """A real PostgreSQL with prepared transactions enabled.

    SEMEL_EOS_PG_URI names an external server (it must allow prepared
    transactions); otherwise a pgserver instance is started in a temp dir,
    reachable only through its Unix socket, and stopped afterwards.
    """
    external = os.environ.get("SEMEL_EOS_PG_URI")
    if external:
        yield external
        return
    import shutil
    import tempfile

    import pgserver
    from pgserver._commands import pg_ctl
    # Outside pytest's numbered temp dirs: a concurrent pytest session may
    # prune those while this server is still using them.
    pgdata = Path(tempfile.mkdtemp(prefix="semel-eos-pg-"))
    srv = pgserver.get_server(pgdata, cleanup_mode="stop")
    try:
        srv.psql("ALTER SYSTEM SET max_prepared_transactions = 20;")
        # The setting needs a server restart; pg_ctl restart reuses the start options.
        pg_ctl(["-w", "restart"], pgdata=srv.pgdata, user=srv.system_user, timeout=60)
        yield srv.get_uri()
    finally:
        # pgserver's own cleanup only knows the pre-restart postmaster, so stop
        # the server explicitly before letting it drop its handle.
        try:
            pg_ctl(["-w", "stop", "-m", "fast"], pgdata=srv.pgdata, user=srv.system_user, timeout=60)
        except Exception:  # noqa: BLE001 - already stopped
            pass
        srv.cleanup()
        shutil.rmtree(pgdata, ignore_errors=True)


# ---------------------------------------------------------------- S3 (moto's standalone server)

@pytest.fixture(scope="session")
@starts_processes
def s3_endpoint(tmp_path_factory):
    """moto_server over HTTP on a loopback port, started and stopped here."""
    import subprocess
    import sys

    from semel.launch.process import free_port, wait_for_port
    port = free_port()
    exe = Path(sys.executable).parent / "moto_server"
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_for_port("127.0.0.1", port, 60, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)
        log.close()

"""Fixtures shared by the eos integration and chaos tests: real brokers, PostgreSQL, S3.

Loaded by tests/integration/eos/conftest.py and tests/chaos/eos/conftest.py.

The broker is chosen by SEMEL_EOS_BROKER=semel|tansu (default semel, the
project's own broker; tansu shows the runtime also works against a peer). Facts about each broker that the tests
must know are attributes of the fixture, not guesses inside tests.
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from semel.cli.process import SemelBroker, TansuBroker

__all__ = ["BROKER_KIND", "EosBroker", "S3_CLIENT_KW", "eos_broker", "names", "pg_uri", "s3_endpoint", "s3_bucket"]

BROKER_KIND = os.environ.get("SEMEL_EOS_BROKER", "semel")


@dataclass
class EosBroker:
    kind: str
    bootstrap: str
    # Tansu 0.6 drops offset metadata, so the ledger needs the marker topic there.
    keeps_offset_metadata: bool
    # Tansu 0.6 read_committed consumers see aborted records (DESIGN.md).
    read_committed_reliable: bool
    process: object

    def create_topics(self, *specs: tuple[str, int]) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(name, parts, 1) for name, parts in specs], operation_timeout=10)
        for f in futures.values():
            f.result(30)
        self._wait_for_metadata([name for name, _ in specs])

    def _wait_for_metadata(self, names: list[str]) -> None:
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for _ in range(100):
            md = admin.list_topics(timeout=10)
            if all(n in md.topics and not md.topics[n].error for n in names):
                return
            time.sleep(0.1)
        raise TimeoutError(f"topics {names} never appeared in metadata")

    def produce(self, topic: str, values: list[bytes], partition: int = 0) -> None:
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True})
        for v in values:
            p.produce(topic, value=v, partition=partition)
        assert p.flush(30) == 0

    def marker_for(self, name: str) -> str | None:
        """A marker topic when the broker needs one (created here), else None."""
        if self.keeps_offset_metadata:
            return None
        self.create_topics((name, 2))
        return name


def _start(kind: str, tmp: Path):
    if kind == "tansu":
        proc = TansuBroker(log_path=tmp / "tansu.log")
        proc.start()
        return EosBroker("tansu", proc.bootstrap, False, False, proc)
    if kind == "semel":
        proc = SemelBroker(tmp / "data", log_path=tmp / "semel.log",
                           extra_args=["--group-initial-rebalance-delay-ms", "0"])
        proc.start()
        return EosBroker("semel", proc.bootstrap, True, True, proc)
    raise ValueError(f"SEMEL_EOS_BROKER must be tansu or semel, got {kind!r}")


@pytest.fixture(scope="module")
def eos_broker(tmp_path_factory):
    b = _start(BROKER_KIND, tmp_path_factory.mktemp("eos-broker"))
    yield b
    b.process.close()


@pytest.fixture
def names():
    """Unique topic/app names per test so tests can share one broker."""
    tag = uuid.uuid4().hex[:8]

    class N:
        input = f"in_{tag}"
        output = f"out_{tag}"
        marker = f"mark_{tag}"
        app = f"app_{tag}"
    return N


# ---------------------------------------------------------------- PostgreSQL

@pytest.fixture(scope="session")
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
def s3_endpoint(tmp_path_factory):
    """moto_server over HTTP on a loopback port, started and stopped here."""
    import subprocess
    import sys

    from semel.cli.process import free_port, wait_for_port
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


S3_CLIENT_KW = dict(region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture
def s3_bucket(s3_endpoint):
    import boto3
    client = boto3.client("s3", endpoint_url=s3_endpoint, **S3_CLIENT_KW)
    name = f"b-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=name)
    return client, name

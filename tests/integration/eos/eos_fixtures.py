"""Fixtures shared by the eos integration and chaos tests: real brokers, S3 buckets.

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

from semel.launch.process import SemelBroker, TansuBroker

__all__ = ["BROKER_KIND", "EosBroker", "S3_CLIENT_KW", "eos_broker", "names", "s3_bucket"]

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


# PostgreSQL (pg_uri) and S3 (s3_endpoint) are session fixtures of tests/conftest.py
# (tests/support/services.py), so one server of each serves the whole run.

S3_CLIENT_KW = dict(region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture
def s3_bucket(s3_endpoint):
    import boto3
    client = boto3.client("s3", endpoint_url=s3_endpoint, **S3_CLIENT_KW)
    name = f"b-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=name)
    return client, name

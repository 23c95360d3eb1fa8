"""The new admin APIs at the versions aiokafka 0.14's admin client speaks:
CreatePartitions, AlterConfigs/DescribeConfigs, DeleteRecords, DescribeCluster."""
from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.support.brokers import module_broker


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory):
    with module_broker(tmp_path_factory, "admin-aiokafka") as b:
        yield b


async def _scenario(bootstrap):
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
    from aiokafka.admin.records_to_delete import RecordsToDelete
    from aiokafka.errors import InvalidPartitionsError
    from aiokafka.structs import TopicPartition
    name = "aio-" + uuid.uuid4().hex[:8]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    out = {}
    try:
        await admin.create_topics([NewTopic(name, 1, 1)])
        await admin.create_partitions({name: NewPartitions(total_count=3)})
        try:
            await admin.create_partitions({name: NewPartitions(total_count=2)})
        except InvalidPartitionsError:
            out["shrink"] = "INVALID_PARTITIONS"
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name,
                                                  configs={"retention.ms": "424242"})])
        (desc,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
        res = desc.to_object()["resources"][0]
        out["config"] = {c["config_names"]: c["config_value"] for c in res["config_entries"]}["retention.ms"]
        # acks=all: the records are committed (fsynced, so under the high watermark)
        # before DeleteRecords asks to cut at offset 6; acks=1 answers before the fsync.
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for i in range(10):
                await producer.send_and_wait(name, b"x", partition=2)
        finally:
            await producer.stop()
        got = await admin.delete_records({TopicPartition(name, 2): RecordsToDelete(before_offset=6)})
        out["low"] = got[TopicPartition(name, 2)]
        cluster = await admin.describe_cluster()
        out["brokers"] = [b["node_id"] for b in cluster["brokers"]]
    finally:
        await admin.close()
    return out


def test_aiokafka_admin(mbroker):
    out = asyncio.run(_scenario(mbroker.bootstrap))
    assert out == {"shrink": "INVALID_PARTITIONS", "config": "424242", "low": 6, "brokers": [0]}

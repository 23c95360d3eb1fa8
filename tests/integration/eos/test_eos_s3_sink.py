"""S3 sink against moto's standalone server over HTTP (boto3 client)."""
from __future__ import annotations

import pytest

from tests.support.eos_cycles import cycle_into

from semel.eos import OK, Fatal
from semel.eos.sinks.s3 import S3Sink
from semel.eos.testing import check_sink_contract


def keys(client, bucket):
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))


def test_s3_sink_meets_the_contract(s3_bucket):
    client, bucket = s3_bucket
    check_sink_contract(lambda: S3Sink(bucket, "out/", client=client),
                        lambda: S3Sink(bucket, "out/", client=client).committed_batches(),
                        [{"a": 1}, {"a": 2}, {"a": 3}, {"a": 4}])


def test_layout_pending_then_copied_out(s3_bucket):
    client, bucket = s3_bucket
    s = S3Sink(bucket, "p/", client=client)
    s.stage({"x": 1})
    assert s.prepare("app-0-1") is OK
    assert keys(client, bucket) == ["p/__pending__/app-0-1/batch.jsonl"]
    assert s.commit("app-0-1") is OK
    assert keys(client, bucket) == ["p/data/app-0-1.jsonl"]
    body = client.get_object(Bucket=bucket, Key="p/data/app-0-1.jsonl")["Body"].read()
    assert body == b'{"x":1}\n'


def test_crash_between_copy_and_delete_is_finished_by_recover(s3_bucket):
    client, bucket = s3_bucket
    s = S3Sink(bucket, client=client)
    s.prepare("app-0-2", [1])
    client.copy_object(Bucket=bucket, Key="data/app-0-2.jsonl",
                       CopySource={"Bucket": bucket, "Key": "__pending__/app-0-2/batch.jsonl"})
    assert s.recover() == []                         # committed: only the clean-up was missing
    assert keys(client, bucket) == ["data/app-0-2.jsonl"]
    assert s.commit("app-0-2") is OK and isinstance(s.abort("app-0-2"), Fatal)


def test_bad_configuration_and_rows(s3_bucket):
    client, bucket = s3_bucket
    with pytest.raises(ValueError, match="prefix"):
        S3Sink(bucket, "noslash", client=client)
    with pytest.raises(ValueError, match="data_dir"):
        S3Sink(bucket, client=client, data_dir="__pending__/")
    with pytest.raises(TypeError, match="JSON"):
        S3Sink(bucket, client=client).stage(b"bytes")


def test_unreachable_endpoint_fails_as_a_value():
    from botocore.config import Config

    from semel.launch.process import free_port
    from semel.eos import Retryable, SinkGuard
    sink = S3Sink("b", endpoint_url=f"http://127.0.0.1:{free_port()}", region_name="us-east-1",
                  aws_access_key_id="x", aws_secret_access_key="x",
                  config=Config(retries={"max_attempts": 1}, connect_timeout=1))
    out = SinkGuard(sink).prepare("app-0-1", [1])
    assert isinstance(out, Retryable) and "EndpointConnectionError" in out.reason


def test_runtime_cycles_into_s3(s3_bucket):
    client, bucket = s3_bucket
    cycle_into(S3Sink(bucket, client=client, name="s3"), 8, lambda v: v, per_cycle=3, fail="flush")
    batches = S3Sink(bucket, client=client).committed_batches()
    assert sorted(v for rows in batches.values() for v in rows) == list(range(8))
    assert not any(k.startswith("__pending__/") for k in keys(client, bucket))

"""Key-compacted topics (cleanup.policy=compact): what they accept.

Kafka refuses a record without a key on a compacted topic (there is nothing to
compact it by); the check reads every record's key, so compressed batches are
decompressed with aiokafka's record codec."""
from __future__ import annotations

from aiokafka.errors import CorruptRecordException, UnsupportedCodecError
from aiokafka.record.default_records import DefaultRecordBatch

from semel.protocol.errors import KafkaError
from semel.protocol.records import BatchHeader


def is_compacted(cleanup_policy: str) -> bool:
    return "compact" in cleanup_policy.split(",")


def check_keys(data, batches: list[tuple[int, BatchHeader]]) -> KafkaError:
    """INVALID_RECORD if any data record has no key, CORRUPT_MESSAGE if a batch cannot
    be decoded; control batches (written by the coordinator) are not checked."""
    view = memoryview(data)
    for pos, hdr in batches:
        if hdr.is_control:
            continue
        try:
            if any(rec.key is None for rec in DefaultRecordBatch(bytes(view[pos:pos + hdr.size]))):
                return KafkaError.INVALID_RECORD
        except (CorruptRecordException, UnsupportedCodecError, ValueError):
            return KafkaError.CORRUPT_MESSAGE
    return KafkaError.NONE

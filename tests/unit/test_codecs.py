"""Bounded decompression (semel.protocol.codecs): every Kafka codec reads back the
records exactly, a batch that would expand past the limit is refused before the
memory is taken, and damaged payloads are CORRUPT_MESSAGE, never an exception of
another kind."""
from __future__ import annotations

import struct

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from kafka.codec import snappy_encode

from semel.protocol import codecs
from semel.protocol.errors import KafkaError
from semel.protocol.records import HEADER_SIZE, iter_records

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _batch(codec: int, n: int = 500, value: bytes = b"v" * 1000) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for i in range(n):
        b.append(i, timestamp=1000 + i, key=b"k%d" % i, value=value, headers=[("h", b"%d" % i)])
    return bytes(b.build())


def _with_payload(raw: bytes, payload: bytes) -> bytes:
    head = bytearray(raw[:HEADER_SIZE])
    struct.pack_into(">i", head, 8, HEADER_SIZE - 12 + len(payload))
    return bytes(head) + payload


@pytest.mark.parametrize("codec", CODECS.values(), ids=CODECS.keys())
def test_each_codec_reads_back_exactly(codec):
    plain = list(iter_records(_batch(0)))
    got = list(iter_records(codecs.uncompressed_batch(_batch(codec), 10 << 20)))
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in got] == \
           [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in plain]


@pytest.mark.parametrize("codec", CODECS.values(), ids=CODECS.keys())
def test_a_batch_expanding_past_the_limit_is_refused(codec):
    raw = _batch(codec, n=64, value=bytes(64 << 10))     # 4 MiB of zeros: a few KiB compressed
    assert len(raw) < 1 << 20
    with pytest.raises(codecs.DecodeError) as e:
        codecs.uncompressed_batch(raw, 1 << 20)
    assert e.value.error == KafkaError.MESSAGE_TOO_LARGE


def test_xerial_framed_snappy_as_java_clients_send_it():
    plain = _batch(0)
    records = plain[HEADER_SIZE:]
    raw = _with_payload(_batch(2), snappy_encode(records, xerial_compatible=True, xerial_blocksize=4096))
    assert raw[HEADER_SIZE:HEADER_SIZE + 8] == b"\x82SNAPPY\x00"
    assert [r.key for r in iter_records(codecs.uncompressed_batch(raw, 10 << 20))] == \
           [r.key for r in iter_records(plain)]
    with pytest.raises(codecs.DecodeError) as e:
        codecs.uncompressed_batch(raw, 64 << 10)
    assert e.value.error == KafkaError.MESSAGE_TOO_LARGE


@pytest.mark.parametrize("codec", CODECS.values(), ids=CODECS.keys())
@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_damaged_payloads_are_corrupt_message(codec, damage):
    raw = _batch(codec)
    payload = bytearray(raw[HEADER_SIZE:])
    if damage == "flip":
        for i in range(0, len(payload), 7):
            payload[i] ^= 0x5A
    elif damage == "truncate":
        payload = payload[: len(payload) // 2]
    else:
        payload = bytearray(b"\x00\xff" * 300)
    try:
        out = codecs.uncompressed_batch(_with_payload(raw, bytes(payload)), 10 << 20)
    except codecs.DecodeError as exc:
        assert exc.error in (KafkaError.CORRUPT_MESSAGE, KafkaError.MESSAGE_TOO_LARGE)
    else:   # some damage still decompresses: then the records are what is checked next
        assert isinstance(out, bytes)


def test_unknown_codec_is_unsupported():
    raw = bytearray(_batch(0))
    struct.pack_into(">h", raw, 21, 7)
    with pytest.raises(codecs.DecodeError) as e:
        codecs.uncompressed_batch(bytes(raw), 1 << 20)
    assert e.value.error == KafkaError.UNSUPPORTED_COMPRESSION_TYPE

"""Structure-aware request fuzzing from the codec's own schemas.

`random_request(rng, api_key, version)` walks the Kafka message schema that
kafka-python generated its request class from and fills every field present at
that version with a value chosen to hurt: limits of the integer type (negative
sizes, 2^31-1 timeouts, producer ids and epochs at their ends), empty, long and
duplicate lists, unknown and real topic names, records that are valid batches,
garbage, or a valid batch with one field changed. `mutate(rng, frame)` then
damages the encoded bytes (flipped bytes, truncation, a length prefix changed).

Used by tests/property/test_wire_fuzz.py (short, under hypothesis) and
bench/fuzz_long.py (a million requests).
"""
from __future__ import annotations

import random
import struct
import uuid

from semel.protocol import records
from semel.protocol.messages import encode_request, request_class

INT_LIMITS = {
    "int8": (-2**7, 2**7 - 1), "int16": (-2**15, 2**15 - 1), "int32": (-2**31, 2**31 - 1),
    "int64": (-2**63, 2**63 - 1), "uint16": (0, 2**16 - 1),
}
# Topics that exist on the fuzz broker (requests naming them reach the storage paths).
KNOWN_TOPICS = ["fuzz"]


def _int(rng: random.Random, kind: str) -> int:
    lo, hi = INT_LIMITS[kind]
    pick = rng.random()
    if pick < 0.35:
        return rng.choice([lo, hi, -1, 0, 1, -2, hi - 1, lo + 1])
    if pick < 0.75:
        return rng.randint(max(lo, -3), min(hi, 8))
    return rng.randint(lo, hi)


def _string(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.4:
        return rng.choice(KNOWN_TOPICS)
    if pick < 0.55:
        return ""
    if pick < 0.65:
        return "__consumer_offsets" if rng.random() < 0.5 else "__transaction_state"
    if pick < 0.7:
        return "x" * rng.randint(200, 3000)
    n = rng.randint(1, 12)
    return "".join(rng.choice("abcz.-_ é\x00/") for _ in range(n))


def _records(rng: random.Random) -> bytes | None:
    pick = rng.random()
    if pick < 0.1:
        return None
    if pick < 0.2:
        return rng.randbytes(rng.randint(0, 200))
    batch = records.build_batch(
        [(rng.randbytes(3), rng.randbytes(rng.randint(0, 20))) for _ in range(rng.randint(1, 4))],
        producer_id=rng.choice([-1, 0, 1, 2**63 - 1, rng.randint(0, 1000)]),
        producer_epoch=rng.choice([-1, 0, 2**15 - 1, rng.randint(0, 5)]),
        base_sequence=rng.choice([-1, 0, 2**31 - 1, rng.randint(0, 10)]),
        transactional=rng.random() < 0.3, control=rng.random() < 0.05)
    if pick < 0.6:
        return batch
    buf = bytearray(batch)
    # One header field changed, the CRC re-sealed so the damage reaches past CRC checks.
    offset, fmt = rng.choice([(8, ">i"), (16, ">b"), (21, ">h"), (23, ">i"), (43, ">q"), (51, ">h"),
                              (53, ">i"), (57, ">i"), (records.HEADER_SIZE, ">b")])
    if offset + struct.calcsize(fmt) <= len(buf):
        lo, hi = {">b": (-128, 127), ">h": (-2**15, 2**15 - 1), ">i": (-2**31, 2**31 - 1),
                  ">q": (-2**63, 2**63 - 1)}[fmt]
        struct.pack_into(fmt, buf, offset, rng.choice([lo, hi, -1, 0, rng.randint(lo, hi)]))
    if rng.random() < 0.8:
        import crc32c
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def _list_len(rng: random.Random) -> int:
    return rng.choice([0, 1, 1, 1, 2, 3, rng.randint(0, 40)])


def _value(rng: random.Random, field, version: int, depth: int):
    if field.is_struct_array():
        n = _list_len(rng)
        items = [_struct(rng, field.array_of, version, depth + 1) for _ in range(min(n, 1 if depth > 2 else n))]
        if items and rng.random() < 0.2:
            items = items + items        # duplicates
        return items
    if field.is_struct():
        return _struct(rng, field, version, depth + 1)
    kind = field.type_str
    nullable = field.nullable_for_version_q(version)
    if nullable and rng.random() < 0.1:
        return None
    if kind.startswith("[]"):
        inner = kind[2:]
        items = [_scalar(rng, inner) for _ in range(_list_len(rng))]
        if items and inner == "string" and rng.random() < 0.1:
            items[rng.randrange(len(items))] = None      # a null element: never valid in Kafka
        return items
    return _scalar(rng, kind)


def _scalar(rng: random.Random, kind: str):
    if kind in INT_LIMITS:
        return _int(rng, kind)
    if kind == "string":
        return _string(rng)
    if kind == "bytes":
        return rng.randbytes(rng.randint(0, 64))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "uuid":
        return uuid.UUID(int=rng.choice([0, rng.getrandbits(128)]))
    if kind == "records":
        return _records(rng)
    if kind == "float64":
        return rng.choice([0.0, -1.0, 1e308])
    raise ValueError(f"no generator for schema type {kind}")


def _struct(rng: random.Random, field, version: int, depth: int):
    values = {f.name: _value(rng, f, version, depth) for f in field._fields if f.for_version_q(version)}
    return field.data_class(**values)


def random_request(rng: random.Random, api_key: int, version: int, corr: int = 1) -> bytes:
    """A framed request of this API and version, every field drawn from the schema."""
    cls = request_class(api_key)
    values = {f.name: _value(rng, f, version, 0) for f in cls._struct._fields if f.for_version_q(version)}
    body = cls(version=version, **values)
    client_id = rng.choice(["fuzz", "", "c" * 300])
    return encode_request(api_key, version, corr, client_id, body)


def mutate(rng: random.Random, frame: bytes) -> bytes:
    """Damage an encoded frame: flip bytes, truncate (size re-sealed or not), change
    a length-looking int inside, or set the header's api key/version out of range."""
    buf = bytearray(frame)
    kind = rng.choice(["flip", "truncate", "length", "header", "size"])
    if kind == "flip" and len(buf) > 12:
        for _ in range(rng.randint(1, 6)):
            buf[rng.randrange(12, len(buf))] = rng.randrange(256)
    elif kind == "truncate" and len(buf) > 5:
        buf = buf[:rng.randrange(5, len(buf))]
        if rng.random() < 0.8:
            struct.pack_into(">i", buf, 0, len(buf) - 4)
    elif kind == "length" and len(buf) > 16:
        pos = rng.randrange(12, len(buf) - 4)
        struct.pack_into(">i", buf, pos, rng.choice([-2, -1, 0x7FFFFFFF, 0x7FFF, len(buf), rng.randint(-5, 1000)]))
    elif kind == "header" and len(buf) >= 8:
        struct.pack_into(">hh", buf, 4, rng.choice([rng.randint(-3, 80), 0x7FFF]), rng.randint(-2, 20))
    elif len(buf) >= 4:
        struct.pack_into(">i", buf, 0, rng.choice([-1, 0, len(buf) - 3, 0x7FFFFFFF]))
    return bytes(buf)


def advertised(supported: dict[int, tuple[int, int]]) -> list[tuple[int, int]]:
    """Every (api key, version) the broker advertises and the codec knows."""
    out = []
    for key, (lo, hi) in sorted(supported.items()):
        try:
            request_class(key)
        except KeyError:
            continue
        out.extend((key, v) for v in range(lo, hi + 1))
    return out


# --- driving a broker with fuzz frames -------------------------------------------

class FuzzStats:
    """What happened to the frames sent (the broker answered, closed the connection,
    or kept waiting: a long poll or a frame whose size promises more bytes)."""

    def __init__(self) -> None:
        self.sent = 0
        self.answered = 0
        self.closed = 0
        self.pending = 0
        self.per_api: dict[int, int] = {}

    def as_dict(self) -> dict:
        return {"sent": self.sent, "answered": self.answered, "closed_by_broker": self.closed,
                "no_answer_within_wait": self.pending,
                "per_api_key": {str(k): v for k, v in sorted(self.per_api.items())}}


def fuzz_frame(rng: random.Random, pairs: list[tuple[int, int]], corr: int) -> tuple[int, bytes]:
    """(api key, frame): a schema-drawn request, mutated half of the time."""
    key, version = rng.choice(pairs)
    frame = random_request(rng, key, version, corr)
    if rng.random() < 0.5:
        frame = mutate(rng, frame)
    return key, frame


async def fuzz_worker(host: str, port: int, rng: random.Random, pairs, count: int, stats: FuzzStats,
                      answer_wait_s: float = 0.25) -> None:
    """Send `count` fuzz frames over one connection, reconnecting whenever the broker
    closed it or a frame got no answer within `answer_wait_s` (then we close it)."""
    import asyncio
    reader = writer = None
    for i in range(count):
        if writer is None:
            reader, writer = await asyncio.open_connection(host, port)
        key, frame = fuzz_frame(rng, pairs, i & 0x7FFFFFFF)
        stats.sent += 1
        stats.per_api[key] = stats.per_api.get(key, 0) + 1
        try:
            writer.write(frame)
            await writer.drain()
            head = await asyncio.wait_for(reader.readexactly(4), answer_wait_s)
            await asyncio.wait_for(reader.readexactly(struct.unpack(">i", head)[0]), answer_wait_s * 4)
            stats.answered += 1
            continue
        except asyncio.TimeoutError:
            stats.pending += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            stats.closed += 1
        writer.close()
        reader = writer = None
    if writer is not None:
        writer.close()

"""Request decoding and response encoding on top of kafka-python's codec.

kafka-python 3.x generates its message classes from Kafka's JSON message
specs, so we use them for every API body and keep only the framing rules here:
which header version a request or response uses, and the ApiVersions
fallback for versions we do not speak.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any

from kafka.protocol import admin, consumer, metadata, producer, sasl
from kafka.protocol.api_header import RequestHeader, ResponseHeader
from kafka.protocol.api_message import ApiMessage

from .api_keys import ApiKey
from .errors import KafkaError, ProtocolError
from .extra_messages import EXTRA_MESSAGES
from .fetch_response import encode_fetch
from .produce_request import FAST_VERSIONS as FAST_PRODUCE_VERSIONS
from .produce_request import Cursor, DecodeInThread, decode_produce
from .produce_response import encode_produce


def _collect(kind: str) -> dict[int, type[ApiMessage]]:
    out: dict[int, type[ApiMessage]] = {}
    # sasl has no __all__: its classes are read by name.
    for mod in (admin, consumer, metadata, producer, sasl):
        for name in getattr(mod, "__all__", dir(mod)):
            obj = getattr(mod, name)
            if not (isinstance(obj, type) and issubclass(obj, ApiMessage)):
                continue
            cls: Any = obj   # kafka-python is untyped: a message class's attributes are Any
            if cls.type == kind:
                out[cls.API_KEY] = cls
    for cls in EXTRA_MESSAGES:
        if cls.type == kind:
            out.setdefault(cls.API_KEY, cls)
    return out


REQUEST_CLASSES = _collect("request")
RESPONSE_CLASSES = _collect("response")
API_VERSIONS_KEY = ApiKey.API_VERSIONS
PRODUCE_KEY = ApiKey.PRODUCE
FETCH_KEY = ApiKey.FETCH
_HEAD = struct.Struct(">hhi")


@dataclass(slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # a kafka-python request object


class UnsupportedVersion(Exception):
    """A known API key at a version outside what the broker advertises."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int):
        super().__init__(f"api {api_key} v{api_version} not supported")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


def peek_header(frame: bytes | bytearray) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) without decoding the rest."""
    if len(frame) < _HEAD.size:
        raise ProtocolError("request shorter than its header")
    return _HEAD.unpack_from(frame, 0)


def decode_request(frame: bytes | bytearray, supported: dict[int, tuple[int, int]], *,
                   loop_partitions: int | None = None) -> Request:
    """Decode one frame payload. `supported` maps api key -> (min, max).

    With loop_partitions set (a large frame, on the event loop) only a Produce body
    naming at most that many partitions is decoded: its cost is per partition, not
    per byte (the records stay views), so a 1 MiB batch decodes in microseconds and
    the thread hop would cost more. Anything else raises DecodeInThread, before any
    work for another API and after at most loop_partitions entries for a Produce."""
    api_key, api_version, correlation_id = peek_header(frame)
    cls = REQUEST_CLASSES.get(api_key)
    if cls is None or api_key not in supported:
        raise ProtocolError(f"unknown api key {api_key}")
    lo, hi = supported[api_key]
    if not lo <= api_version <= hi:
        raise UnsupportedVersion(api_key, api_version, correlation_id)
    fast_produce = api_key == PRODUCE_KEY and api_version in FAST_PRODUCE_VERSIONS
    if loop_partitions is not None and not fast_produce:
        raise DecodeInThread()
    view = memoryview(frame)
    try:
        client_id, pos = _read_header(view, cls.flexible_version_q(api_version))
        if fast_produce:
            # Records stay views of the frame (no copy): the produce hot path.
            return Request(api_key, api_version, correlation_id, client_id,
                           decode_produce(view, pos, api_version, loop_partitions))
        body = cls.decode(view[pos:], version=api_version)
    except DecodeInThread:
        raise
    except Exception as exc:  # any malformed body is the client's fault
        # Bounded: the codec's message may quote the whole bad string (a log line per byte sent).
        raise ProtocolError(f"malformed api {api_key} v{api_version}: {_short(repr(exc))}") from None
    bad = _null_where_not_allowed(body, cls._struct, api_version)
    if bad is not None:
        # The codec reads length -1 as None for any array or string; Kafka's own parser
        # refuses it where the schema does not allow null, and handlers rely on that.
        raise ProtocolError(f"malformed api {api_key} v{api_version}: null {bad}")
    return Request(api_key, api_version, correlation_id, client_id, body)


def _read_header(view: memoryview, flexible: bool) -> tuple[str | None, int]:
    """(client_id, where the body starts). Read here rather than by the codec, whose
    header decoder copies the whole frame into a BytesIO first. client_id is a
    classic nullable string in every header version; v2 (flexible) adds tags."""
    cur = Cursor(view, _HEAD.size, flexible=False)
    client_id = cur.string(nullable=True)
    if flexible:
        cur.flexible = True
        cur.skip_tags()
    return client_id, cur.pos


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


# (field name, nullable, nested struct or None, is an array)
_NullPlan = list[tuple[str, bool, Any, bool]]
_NULL_PLANS: dict[tuple[int, int], _NullPlan] = {}


def _null_plan(struct: Any, version: int) -> _NullPlan:
    """(name, nullable, nested struct or None) for the fields of `struct` at `version`
    that can decode as None: arrays, strings, bytes, structs."""
    key = (id(struct), version)
    plan = _NULL_PLANS.get(key)
    if plan is None:
        plan = []
        for f in struct._fields:
            if not f.for_version_q(version):
                continue
            nested = f.array_of if f.is_struct_array() else f if f.is_struct() else None
            if nested is None and not f.is_array() and f.type_str not in ("string", "bytes", "records"):
                continue
            plan.append((f.name, f.nullable_for_version_q(version), nested, f.is_array()))
        _NULL_PLANS[key] = plan
    return plan


def _null_where_not_allowed(obj: Any, struct: Any, version: int) -> str | None:
    """The name of the first field holding None where the schema forbids it."""
    for name, nullable, nested, is_array in _null_plan(struct, version):
        value = getattr(obj, name, None)
        if value is None:
            if not nullable:
                return name
            continue
        if nested is None:
            # Elements of a string array are never nullable in Kafka's schemas.
            if is_array and None in value:
                return f"{name}[]"
            continue
        for item in (value if is_array else (value,)):
            bad = _null_where_not_allowed(item, nested, version)
            if bad is not None:
                return f"{name}.{bad}"
    return None


class Encoded:
    """A response body encoded already, for the version it was encoded at: a handler
    whose answer never changes keeps one (ApiVersions, sent by every new client
    connection, is ~60 entries of kafka-python objects to build and encode)."""
    __slots__ = ("payload",)

    def __init__(self, payload: bytes):
        self.payload = payload


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Any) -> bytes:
    """Frame a response object (or an Encoded body). The header is flexible when the
    body version is, except for ApiVersions whose response header never is."""
    cls = RESPONSE_CLASSES[api_key]
    flexible = cls.flexible_version_q(api_version) and api_key != API_VERSIONS_KEY
    head = ResponseHeader(correlation_id=correlation_id).encode(flexible=flexible)
    payload = body.payload if isinstance(body, Encoded) else body.encode(version=api_version)
    # One copy of a possibly large Fetch payload, not three.
    return b"".join((struct.pack(">i", len(head) + len(payload)), head, payload))


def encode_response_parts(api_key: int, api_version: int, correlation_id: int, body: Any) -> list[Any]:
    """encode_response as pieces to write in order. A Fetch response keeps each
    partition's records as the buffer storage read them into (fetch_response.py)."""
    if api_key == FETCH_KEY:
        pieces = encode_fetch(api_version, correlation_id, body)
        if pieces is not None:
            return pieces
    elif api_key == PRODUCE_KEY:
        # The handler's plain ProduceAnswer has no generic encoding: it serves v3-v9,
        # which encode_produce always takes.
        frame = encode_produce(api_version, correlation_id, body)
        if frame is not None:
            return [frame]
    return [encode_response(api_key, api_version, correlation_id, body)]


def unsupported_api_versions_response(correlation_id: int, supported: dict[int, tuple[int, int]]) -> bytes:
    """Kafka's answer to a too-new ApiVersions request: header v0, body v0,
    UNSUPPORTED_VERSION plus our ranges, so the client retries lower."""
    cls = RESPONSE_CLASSES[API_VERSIONS_KEY]
    body = cls(
        error_code=KafkaError.UNSUPPORTED_VERSION,
        api_keys=[cls.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                  for k, (lo, hi) in sorted(supported.items())],
    )
    return encode_response(API_VERSIONS_KEY, 0, correlation_id, body)


def partition_count(body: Any, stop_above: int) -> int:
    """Entries of the lists nested one level inside the request's top-level lists:
    the partitions of every topic-shaped request (Produce, Fetch, ListOffsets,
    OffsetCommit, AddPartitionsToTxn, ...), and for flat lists (Metadata topics,
    group ids) the list itself. Stops counting once past `stop_above`."""
    total = 0
    for field in body._struct._fields:
        if not field.is_array():
            continue
        items = getattr(body, field.name, None) or ()
        if not field.is_struct_array():
            total += len(items)
            continue
        nested = [f.name for f in field.array_of._fields if f.is_array()]
        if not nested:
            total += len(items)
        for item in items:
            total += sum(len(getattr(item, name, None) or ()) for name in nested)
            if total > stop_above:
                return total
    return total


def response_class(api_key: int) -> type[ApiMessage]:
    return RESPONSE_CLASSES[api_key]


def request_class(api_key: int) -> type[ApiMessage]:
    return REQUEST_CLASSES[api_key]


def spec_max_version(api_key: int) -> int:
    version: int = REQUEST_CLASSES[api_key].max_version
    return version


def decode_response(api_key: int, api_version: int, frame: bytes) -> tuple[int, Any]:
    """Client side: (correlation_id, body) from a frame payload."""
    cls = RESPONSE_CLASSES[api_key]
    flexible = cls.flexible_version_q(api_version) and api_key != API_VERSIONS_KEY
    buf = io.BytesIO(frame)
    hdr = ResponseHeader.decode(buf, flexible=flexible)
    body = cls.decode(frame[buf.tell():], version=api_version)
    return hdr.correlation_id, body


def encode_request(api_key: int, api_version: int, correlation_id: int, client_id: str, body: Any) -> bytes:
    """Client side: a framed request."""
    body.API_VERSION = api_version
    body.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(body.encode(header=True, framed=True))


__all__ = [
    "Encoded", "Request", "UnsupportedVersion", "decode_request", "encode_response", "encode_response_parts",
    "decode_response",
    "encode_request", "unsupported_api_versions_response", "response_class", "request_class",
    "peek_header", "spec_max_version", "RequestHeader", "partition_count",
]

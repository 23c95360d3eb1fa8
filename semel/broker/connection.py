"""One client connection: frames in, responses out, in request order.

Kafka answers requests of a connection in the order they arrived. Handlers run
one at a time in that order (so appends keep the producer's order), but a
handler may return a `Deferred` for work that only waits (fsync of an acks=all
produce): the connection goes on reading while the writer task awaits the
deferred responses in order. Malformed input closes the connection; it never
reaches storage.

Limits (broker config, Kafka's names): max_connections / max_connections_per_ip
close a new connection at once; connections_max_idle_ms closes a connection that
sent nothing for that long; request_timeout_ms drops a connection whose frame
stopped arriving half-way; max_partitions_per_request closes a connection whose
request names more partitions (bounding the CPU one request can take). Each is
logged with the peer and counted in semel_connections_rejected_total{reason}.
`Broker.limits` (a ConnectionLimits) enforces the first three.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import cast

from ..protocol.errors import ProtocolError
from ..protocol.messages import (
    API_VERSIONS_KEY, DecodeInThread, UnsupportedVersion, decode_request, encode_response_parts, partition_count,
    unsupported_api_versions_response,
)
from .auth_gate import authenticated_enough, guarded
from .config import BrokerConfig, Listener
from .coordinator_gate import coordinator_guard
from .deferred import Deferred
from .frame_reader import FrameReader
from .metrics import BrokerMetrics
from .request_times import ApiTimes
from .router import ROUTES, RequestContext, supported_versions
from .session import Connection
from .services import Services

log = logging.getLogger("semel.broker.conn")

# How many responses may wait to be written before we stop reading (backpressure).
MAX_PENDING_RESPONSES = 32
# Frames larger than this are decoded in a worker thread. Decoding is pure Python at
# ~1.5 us a partition: a 100 MiB Fetch naming millions of partitions once held the loop
# for seconds before any limit could look at it. A thread gives the loop its turn every
# few milliseconds (the interpreter's switch interval); small frames skip the hop.
DECODE_IN_THREAD_BYTES = 256 * 1024
# ...except a Produce naming at most this many partitions: its decode costs per
# partition (records stay views of the frame), well under a millisecond here, less
# than the hop (a 1 MiB batch of one producer is such a frame, every request).
DECODE_ON_LOOP_PARTITIONS = 64

# A response's pieces, written in order
Pieces = list[bytes | bytearray | memoryview]


class Answer:
    """An answer waiting to be written: its pieces, or the Deferred that gives its body,
    with the request's times so far (semel.broker.request_times): seconds queued behind
    earlier frames of its read, in the handler (local), encoding (an answer ready at
    once is encoded before it queues), and the perf_counter() when it queued."""
    __slots__ = ("ctx", "pieces", "deferred", "times", "queued_s", "local_s", "encode_s", "queued_at",
                 "picked", "ready")

    def __init__(self, ctx: RequestContext, pieces: Pieces | None, deferred: Deferred | None, times: ApiTimes,
                 queued_s: float, local_s: float, encode_s: float, queued_at: float) -> None:
        self.ctx, self.pieces, self.deferred, self.times = ctx, pieces, deferred, times
        self.queued_s, self.local_s, self.encode_s, self.queued_at = queued_s, local_s, encode_s, queued_at
        self.picked = self.ready = queued_at   # when the writer took it up, when its body was there

    def observe(self, written: float) -> None:
        picked, ready = self.picked, self.ready
        self.times.observe(self.queued_s, self.local_s, picked - self.queued_at, ready - picked,
                           self.encode_s + written - ready)


Pending = Pieces | Answer


class _BadInputLog:
    """Lines about clients' bad input and refused connections, at most `per_second`
    a second: one client sending garbage in a loop must not fill the disk with the
    broker's log. What was left out is counted in the next line that gets through."""

    def __init__(self, per_second: int = 20):
        self.per_second = per_second
        self._window = 0
        self._count = 0
        self._dropped = 0

    def warning(self, msg: str, *args: object) -> None:
        now = int(time.monotonic())
        if now != self._window:
            self._window, self._count = now, 0
        self._count += 1
        if self._count > self.per_second:
            self._dropped += 1
            return
        if self._dropped:
            msg = f"{msg} (and {self._dropped} similar lines left out)"
            self._dropped = 0
        log.warning(msg, *args)


bad_input_log = _BadInputLog()


class _Close(Exception):
    pass


class ConnectionLimits:
    """Counts connections per address and closes idle and stalled ones.

    The sweep runs on a timer instead of a timeout around every read: one timer
    for the broker costs nothing on the hot path."""

    def __init__(self, config: BrokerConfig, metrics: BrokerMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.open: set[Connection] = set()
        self.per_ip: Counter[str] = Counter()

    def admit(self, conn: Connection) -> bool:
        cfg = self.config
        if len(self.open) >= cfg.max_connections:
            return self._refuse(conn, "max_connections", cfg.max_connections)
        if self.per_ip[conn.ip] >= cfg.max_connections_per_ip:
            return self._refuse(conn, "max_connections_per_ip", cfg.max_connections_per_ip)
        self.open.add(conn)
        self.per_ip[conn.ip] += 1
        return True

    def release(self, conn: Connection) -> None:
        if conn in self.open:
            self.open.discard(conn)
            self.per_ip[conn.ip] -= 1
            if self.per_ip[conn.ip] <= 0:
                del self.per_ip[conn.ip]

    def _refuse(self, conn: Connection, reason: str, limit: int) -> bool:
        self.metrics.connections_rejected.labels(reason).inc()
        bad_input_log.warning("refusing connection from %s: %s=%d reached", conn.peer, reason, limit)
        return False

    def sweep_interval_s(self) -> float:
        shortest = min(self.config.connections_max_idle_ms, self.config.request_timeout_ms) / 1000
        return min(max(shortest / 4, 0.01), 1.0)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s())
            self.sweep(time.monotonic())

    def sweep(self, now: float) -> None:
        idle_s = self.config.connections_max_idle_ms / 1000
        stall_s = self.config.request_timeout_ms / 1000
        for conn in list(self.open):
            quiet = now - conn.last_active
            if conn.decoder.buffered and quiet > stall_s:
                self._drop(conn, "stalled_frame", f"a frame stopped arriving ({conn.decoder.buffered} bytes "
                                                  f"buffered, nothing for {quiet:.1f}s > request_timeout_ms)")
            elif quiet > idle_s:
                self._drop(conn, "idle", f"idle for {quiet:.1f}s > connections_max_idle_ms")

    def _drop(self, conn: Connection, reason: str, why: str) -> None:
        self.metrics.connections_rejected.labels(reason).inc()
        log.info("closing %s: %s", conn.peer, why)
        self.release(conn)
        conn.transport.abort()


async def serve(services: Services, limits: ConnectionLimits, reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter, listener: Listener | None = None) -> None:
    peer, ip = _peer(writer)
    transport = cast(asyncio.Transport, writer.transport)   # a socket's: it reads too
    conn = Connection(peer, ip, transport, _frames(reader, writer, services.config.max_request_bytes))
    conn.listener = listener
    if not limits.admit(conn):
        writer.transport.abort()
        return
    try:
        await _serve(services, conn, reader, writer)
    except asyncio.CancelledError:
        # The broker is stopping (asyncio.run cancels every connection's task). The task
        # must end as returned, not as cancelled: the stream server's done-callback asks a
        # cancelled task for its exception, which raises there and is logged as an ERROR
        # with a traceback on every clean stop. Nobody awaits this task.
        writer.transport.abort()
    finally:
        limits.release(conn)


def _frames(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_frame_bytes: int) -> FrameReader:
    """Where the connection's frames come from: plain TCP and TLS alike read them
    straight into their buffers (frame_reader.FrameReader). TLS once went through the
    StreamReader: each request's plaintext was copied three more times (the
    transport's join, the stream buffer, the frame decoder)."""
    return FrameReader.take_over(reader, writer, max_frame_bytes)


async def _serve(services: Services, conn: Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    peer, source = conn.peer, conn.decoder
    queue: asyncio.Queue[Pending | None] = asyncio.Queue(MAX_PENDING_RESPONSES)
    writer_task = asyncio.create_task(_write_loop(writer, queue, peer, services.metrics))
    try:
        while not writer_task.done() and not conn.closing:
            frames = await source.next()
            if frames is None:
                break
            conn.last_active = time.monotonic()
            read = time.perf_counter()
            services.metrics.bytes_in.inc(sum(4 + len(f) for f in frames))
            for frame in frames:
                item = await _dispatch(services, conn, frame, read)
                if item is not None:
                    await queue.put(item)
                conn.last_active = time.monotonic()
                if conn.closing:
                    break
    except ProtocolError as exc:
        services.metrics.bad_frames.inc()
        bad_input_log.warning("closing %s: %s", peer, exc)
    except _Close:
        services.metrics.bad_frames.inc()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    except Exception:  # our bug, not the client's: say so and close this connection only
        log.exception("connection %s failed", peer)
    except asyncio.CancelledError:
        # The broker is stopping: drop the connection without waiting for
        # pending responses (clients retry), and end quietly.
        writer_task.cancel()
        writer.close()
        return
    await queue.put(None)   # let the writer flush what is already answered
    try:
        await asyncio.wait_for(writer_task, 30)
    except (asyncio.TimeoutError, Exception):
        writer_task.cancel()
    writer.close()


async def _dispatch(services: Services, conn: Connection, frame: bytes | bytearray,
                    read: float) -> Pending | None:
    """Returns the response's pieces (a list of bytes-like: an error answered before any
    handler), an Answer, or None (no response). `read`: when the frame was read.

    The names `req` and `peer` are read by the loop watchdog (broker.watchdog) to
    say which request held the loop: keep them."""
    started = time.perf_counter()   # local time counts the decode too
    peer = conn.peer
    supported = supported_versions()
    try:
        if len(frame) > DECODE_IN_THREAD_BYTES:
            try:
                req = decode_request(frame, supported, loop_partitions=DECODE_ON_LOOP_PARTITIONS)
            except DecodeInThread:
                req = await asyncio.to_thread(decode_request, frame, supported)
        else:
            req = decode_request(frame, supported)
    except UnsupportedVersion as exc:
        if exc.api_key == API_VERSIONS_KEY:
            return [unsupported_api_versions_response(exc.correlation_id, supported)]
        bad_input_log.warning("closing %s: %s", peer, exc)
        raise _Close() from None
    limit = services.config.max_partitions_per_request
    if partition_count(req.body, limit) > limit:
        services.metrics.connections_rejected.labels("max_partitions_per_request").inc()
        bad_input_log.warning("closing %s: api %d v%d names more than max_partitions_per_request=%d partitions",
                    peer, req.api_key, req.api_version, limit)
        raise _Close() from None
    route = ROUTES[req.api_key]
    ctx = RequestContext(services, req.api_key, req.api_version, req.correlation_id, req.client_id, peer, conn)
    if not authenticated_enough(ctx):
        bad_input_log.warning("closing %s: api %d without a live SASL login (none yet, or its session expired)",
                              peer, req.api_key)
        raise _Close() from None
    api = route.fn.__name__
    counted, timed = services.metrics.api(api)
    counted.inc()
    try:
        # ACL checks (auth_gate.py): a denied request or resource is answered with its
        # *_AUTHORIZATION_FAILED code there and never reaches the handler.
        result = await guarded(ctx, req.body, coordinator_guard(route.fn))
    except Exception:
        log.exception("handler %s failed for %s; closing the connection", api, peer)
        raise _Close() from None
    if result is None:
        return None
    decided = time.perf_counter()
    if isinstance(result, Deferred):
        return Answer(ctx, None, result, timed, started - read, decided - started, 0.0, decided)
    try:
        pieces = encode_response_parts(ctx.api_key, ctx.api_version, ctx.correlation_id, result)
    except Exception:  # a response we cannot encode is our bug: say so, then close
        log.exception("cannot encode %s v%d response for %s; closing the connection", api, ctx.api_version, peer)
        raise _Close() from None
    encoded = time.perf_counter()
    return Answer(ctx, pieces, None, timed, started - read, decided - started, encoded - decided, encoded)


async def _write_loop(writer: asyncio.StreamWriter, queue: asyncio.Queue[Pending | None], peer: str,
                      metrics: BrokerMetrics) -> None:
    while True:
        item = await queue.get()
        if item is None:
            return
        if isinstance(item, Answer):
            pieces = await _answer_pieces(item, peer)
            if pieces is None:
                writer.close()
                return
        else:
            pieces = item
        # Piece by piece: a Fetch's records go out as the buffers storage read them
        # into (uvloop queues the pieces and sends them with one writev, no copy).
        for piece in pieces:
            writer.write(piece)
        if isinstance(item, Answer):
            item.observe(time.perf_counter())
        metrics.bytes_out.inc(sum(len(piece) for piece in pieces))
        try:
            await writer.drain()
        except ConnectionError:
            return


async def _answer_pieces(answer: Answer, peer: str) -> Pieces | None:
    """The answer's pieces once its body is there (None: the connection must close)."""
    answer.picked = time.perf_counter()
    if answer.deferred is None:
        answer.ready = answer.picked
        return answer.pieces
    ctx = answer.ctx
    try:
        body = await answer.deferred.awaitable
    except Exception:
        log.exception("deferred response failed for %s; closing", peer)
        return None
    answer.ready = time.perf_counter()
    try:
        return encode_response_parts(ctx.api_key, ctx.api_version, ctx.correlation_id, body)
    except Exception:
        log.exception("cannot encode a deferred response for %s; closing", peer)
        return None


def _peer(writer: asyncio.StreamWriter) -> tuple[str, str]:
    """("host:port", host) of the client."""
    info = writer.get_extra_info("peername")
    return (f"{info[0]}:{info[1]}", str(info[0])) if info else ("?", "?")

"""One client connection: frames in, responses out, in request order.

Kafka answers requests of a connection in the order they arrived. Handlers run
one at a time in that order (so appends keep the producer's order), but a
handler may return a `Deferred` for work that only waits (fsync of an acks=all
produce): the connection goes on reading while the writer task awaits the
deferred responses in order. Malformed input closes the connection; it never
reaches storage.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable

from ..protocol.errors import ProtocolError
from ..protocol.frame import FrameDecoder
from ..protocol.messages import (
    API_VERSIONS_KEY, UnsupportedVersion, decode_request, encode_response,
    unsupported_api_versions_response,
)
from .router import ROUTES, RequestContext, supported_versions

log = logging.getLogger("semel.broker.conn")

# How many responses may wait to be written before we stop reading (backpressure).
MAX_PENDING_RESPONSES = 32


class Deferred:
    """A response that is ready once `awaitable` finishes (it returns the body)."""
    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[Any]):
        self.awaitable = awaitable


class _Close(Exception):
    pass


async def serve(broker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    peer = _peer(writer)
    decoder = FrameDecoder(broker.config.max_request_bytes)
    queue: asyncio.Queue = asyncio.Queue(MAX_PENDING_RESPONSES)
    writer_task = asyncio.create_task(_write_loop(writer, queue, peer, broker.metrics))
    try:
        while not writer_task.done():
            data = await reader.read(1 << 20)
            if not data:
                break
            broker.metrics.bytes_in.inc(len(data))
            for frame in decoder.feed(data):
                item = await _dispatch(broker, frame, peer)
                if item is not None:
                    await queue.put(item)
    except ProtocolError as exc:
        broker.metrics.bad_frames.inc()
        log.warning("closing %s: %s", peer, exc)
    except _Close:
        broker.metrics.bad_frames.inc()
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


async def _dispatch(broker, frame: bytes, peer: str):
    """Returns bytes, a (ctx, Deferred) pair, or None (no response)."""
    supported = supported_versions()
    try:
        req = decode_request(frame, supported)
    except UnsupportedVersion as exc:
        if exc.api_key == API_VERSIONS_KEY:
            return unsupported_api_versions_response(exc.correlation_id, supported)
        log.warning("closing %s: %s", peer, exc)
        raise _Close() from None
    route = ROUTES[req.api_key]
    ctx = RequestContext(broker, req.api_key, req.api_version, req.correlation_id, req.client_id, peer)
    api = route.fn.__name__
    broker.metrics.requests.labels(api).inc()
    started = time.perf_counter()
    try:
        result = await route.fn(ctx, req.body)
    except Exception:
        log.exception("handler %s failed for %s; closing the connection", api, peer)
        raise _Close() from None
    if result is None:
        return None
    if isinstance(result, Deferred):
        return ctx, result, started
    broker.metrics.request_seconds.labels(api).observe(time.perf_counter() - started)
    try:
        return encode_response(ctx.api_key, ctx.api_version, ctx.correlation_id, result)
    except Exception:  # a response we cannot encode is our bug: say so, then close
        log.exception("cannot encode %s v%d response for %s; closing the connection", api, ctx.api_version, peer)
        raise _Close() from None


async def _write_loop(writer: asyncio.StreamWriter, queue: asyncio.Queue, peer: str, metrics) -> None:
    while True:
        item = await queue.get()
        if item is None:
            return
        if isinstance(item, tuple):
            ctx, deferred, started = item
            try:
                body = await deferred.awaitable
            except Exception:
                log.exception("deferred response failed for %s; closing", peer)
                writer.close()
                return
            ctx.broker.metrics.request_seconds.labels(ROUTES[ctx.api_key].fn.__name__).observe(
                time.perf_counter() - started)
            try:
                item = encode_response(ctx.api_key, ctx.api_version, ctx.correlation_id, body)
            except Exception:
                log.exception("cannot encode a deferred response for %s; closing", peer)
                writer.close()
                return
        writer.write(item)
        metrics.bytes_out.inc(len(item))
        try:
            await writer.drain()
        except ConnectionError:
            return


def _peer(writer: asyncio.StreamWriter) -> str:
    info = writer.get_extra_info("peername")
    return f"{info[0]}:{info[1]}" if info else "?"

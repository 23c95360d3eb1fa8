"""An asyncio connection from one broker to another (follower fetching, OffsetForLeaderEpoch,
transaction markers), and `PeerDialer`, which opens it the way the cluster's security asks.

One request at a time per connection, which is how a replica fetcher uses it: the
next fetch is built from what the last one appended. Versions are fixed, not
negotiated: every broker of a cluster runs the same semel.

Like Kafka's inter.broker.listener.name, every broker connects to the same named
listener of its peers (their addresses come from the cluster view) and speaks that
listener's protocol from its own configuration: TLS verifying the peer's certificate
against the CA file and the host name, presenting its own certificate where the
listener asks for one; SASL (PLAIN or SCRAM) with the inter-broker login.
"""
from __future__ import annotations

import asyncio
import logging
import random
import ssl
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from ..client.sasl import login_steps
from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from ..protocol.messages import encode_request, request_class, response_class
from .state import BrokerInfo

log = logging.getLogger("semel.cluster.peer")

_SIZE = struct.Struct(">i")
_CORR = struct.Struct(">i")
_SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")   # strongest first
_SASL_APIS = (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)   # SaslHandshake, SaslAuthenticate


class PeerListener(Protocol):
    """The inter-broker listener as the dialer reads it (semel.broker.config.Listener)."""
    name: str
    protocol: str

    @property
    def sasl(self) -> bool: ...

    @property
    def tls(self) -> bool: ...


class PeerSecurity(Protocol):
    """What the dialer reads of the broker's configuration (semel.broker.config.BrokerConfig)."""
    ssl_cafile: str | None
    ssl_certfile: str | None
    ssl_keyfile: str | None
    sasl_enabled_mechanisms: tuple[str, ...]
    inter_broker_sasl_mechanism: str | None
    inter_broker_user: str | None
    inter_broker_password: str | None

    def inter_broker_listener(self) -> PeerListener: ...


class PeerError(Exception):
    """The peer broke the protocol (wrong correlation id, oversized frame)."""


class PeerAuthError(PeerError):
    """The peer refused this broker's login or TLS handshake, or denied it ClusterAction:
    a configuration problem that retrying soon will not fix (callers back off)."""


class _FrameProtocol(asyncio.BufferedProtocol):
    """Receives size-prefixed response frames straight into one bytearray per frame:
    the event loop's recv_into writes the bytes where the decoder reads them, so a
    follower's megabyte-sized Fetch answers are copied once (kernel to here), not
    three more times through a StreamReader (its chunk, its buffer, the frame).

    Each frame gets its own buffer, sized from its 4-byte prefix: the decoded answer
    hands views of it to the log (a follower's records stay referenced until their
    write in a worker thread has landed), so a buffer is never reused under them."""

    def __init__(self, max_frame: int):
        self._max_frame = max_frame
        self._head = bytearray(4)
        self._buf = self._head          # what get_buffer fills now: the prefix, then the body
        self._filled = 0
        self._frames: asyncio.Queue[bytearray | BaseException] = asyncio.Queue()   # frames, or the error that ended the stream
        self._transport: asyncio.Transport | None = None
        self._closed = False
        self._paused: asyncio.Future[None] | None = None
        self._failure: BaseException | None = None

    # -- asyncio callbacks -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream connection's: asyncio's subclass asyncio.Transport, uvloop's (the broker's
        # loop) implement it without subclassing it, so no isinstance check can say so.
        self._transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self._buf)[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._filled < len(self._buf):
            return
        if self._buf is self._head:
            size = _SIZE.unpack(self._head)[0]
            if not 0 < size <= self._max_frame:
                self._fail(PeerError(f"response frame of {size} bytes"))
                return
            self._buf, self._filled = bytearray(size), 0
            return
        self._frames.put_nowait(self._buf)
        self._buf, self._filled = self._head, 0

    def eof_received(self) -> bool:
        self._fail(asyncio.IncompleteReadError(b"", None))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._fail(exc or asyncio.IncompleteReadError(b"", None))
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)

    def pause_writing(self) -> None:
        self._paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)
        self._paused = None

    # -- for PeerConnection ---------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
            self._frames.put_nowait(exc)
            if self._transport is not None and not isinstance(exc, asyncio.IncompleteReadError):
                self._transport.close()

    async def frame(self) -> memoryview:
        got = await self._frames.get()
        if isinstance(got, BaseException):
            self._frames.put_nowait(got)     # every later read fails the same way
            raise got
        return memoryview(got)

    async def send(self, data: bytes) -> None:
        if self._failure is not None:
            raise self._failure          # as the read would: the stream has ended
        if self._closed or self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("peer connection closed")
        self._transport.write(data)
        if self._paused is not None:
            await self._paused

    def usable(self) -> bool:
        return not self._closed and self._failure is None and self._transport is not None \
            and not self._transport.is_closing()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


async def open_frames(host: str, port: int, max_frame: int, timeout_s: float,
                      ssl_context: ssl.SSLContext | None = None,
                      server_hostname: str | None = None) -> _FrameProtocol:
    loop = asyncio.get_running_loop()
    _, proto = await asyncio.wait_for(loop.create_connection(
        lambda: _FrameProtocol(max_frame), host, port, ssl=ssl_context, server_hostname=server_hostname),
        timeout_s)
    return proto


class PeerConnection:
    def __init__(self, frames: _FrameProtocol, client_id: str):
        self._frames = frames
        self.client_id = client_id
        self._corr = 0
        # KIP-368: the login to repeat, and when (None: the peer set no session lifetime).
        self._login: tuple[str, str, str, float] | None = None
        self._reauth_at: float | None = None
        self._lifetime_ms = 0

    @classmethod
    async def open(cls, host: str, port: int, client_id: str, *, timeout_s: float = 10.0,
                   max_frame: int = 128 * 1024 * 1024) -> "PeerConnection":
        return cls(await open_frames(host, port, max_frame, timeout_s), client_id)

    async def call(self, api_key: int, version: int, timeout_s: float, **fields: object) -> Any:
        """Send one request and wait for its response (asyncio.TimeoutError past timeout_s).
        A login whose session is about to end is renewed first (KIP-368): the peer would
        close the connection at the first other request after it ended."""
        if (self._login is not None and self._reauth_at is not None and api_key not in _SASL_APIS
                and time.monotonic() >= self._reauth_at):
            await self.login(*self._login)
        self._corr += 1
        body = request_class(api_key)(version=version, **fields)
        await self._frames.send(encode_request(api_key, version, self._corr, self.client_id, body))
        return await asyncio.wait_for(self._response(api_key, version), timeout_s)

    async def _response(self, api_key: int, version: int) -> Any:
        frame = await self._frames.frame()
        cls = response_class(api_key)
        corr = _CORR.unpack_from(frame)[0]
        if corr != self._corr:
            raise PeerError(f"correlation id {corr}, expected {self._corr}")
        start = _skip_tagged(frame, 4) if cls.flexible_version_q(version) else 4
        # Decoding from a view: the generic decode_response copies a follower's
        # megabyte-sized Fetch answers several times (about 40x slower here).
        return cls.decode(frame[start:], version=version)

    def usable(self) -> bool:
        """Not closed by either side as far as this end has seen: a peer that dropped an
        idle connection (its connections.max.idle.ms) or restarted has sent FIN or RST,
        which the event loop turns into EOF or a closing transport."""
        return self._frames.usable()

    def close(self) -> None:
        self._frames.close()

    async def login(self, mechanism: str, username: str, password: str, timeout_s: float) -> None:
        """SaslHandshake v1 then SaslAuthenticate (KIP-152 framing); PeerAuthError when refused.
        Where the peer answers with a session lifetime, `call` logs in again at 85-95% of it
        (Kafka's client does the same), on this connection, between two requests."""
        self._reauth_at, self._lifetime_ms = None, 0
        resp = await self.call(ApiKey.SASL_HANDSHAKE, 1, timeout_s, mechanism=mechanism)
        if resp.error_code:
            raise PeerAuthError(f"SASL {mechanism}: {KafkaError(resp.error_code).name} "
                                f"(the peer offers {', '.join(resp.mechanisms or []) or 'none'})")
        from scramp import ScramException
        steps = login_steps(mechanism, username, password)
        try:
            token = next(steps)
            while True:
                token = steps.send(await self._sasl_step(token, timeout_s))
        except StopIteration:
            pass
        except ScramException as exc:   # the peer's proof is wrong: it does not know the user
            raise PeerAuthError(f"SASL {mechanism}: {exc}") from None
        self._login = (mechanism, username, password, timeout_s)
        if self._lifetime_ms > 0:
            self._reauth_at = time.monotonic() + self._lifetime_ms / 1000 * random.uniform(0.85, 0.95)

    async def _sasl_step(self, data: bytes, timeout_s: float) -> bytes:
        resp = await self.call(ApiKey.SASL_AUTHENTICATE, 2, timeout_s, auth_bytes=data)
        if resp.error_code:
            raise PeerAuthError(f"SASL login refused: {resp.error_message or KafkaError(resp.error_code).name}")
        self._lifetime_ms = resp.session_lifetime_ms or 0
        return resp.auth_bytes or b""


@dataclass
class PeerDialer:
    """How this broker connects to its peers: which of their listeners, TLS, SASL.

    The default is the main listener in plain TCP (a cluster without security)."""
    listener: str = "DEFAULT"
    ssl_context: ssl.SSLContext | None = None
    mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout_s: float = 10.0
    _warned: dict[int, float] = field(default_factory=dict, repr=False)

    @classmethod
    def from_config(cls, cfg: PeerSecurity) -> "PeerDialer":
        """From a BrokerConfig; ValueError (one line naming the flag) when something is missing."""
        lst = cfg.inter_broker_listener()
        dialer = cls(listener=lst.name)
        if lst.tls:
            dialer.ssl_context = _client_tls(cfg, lst.name)
        if lst.sasl:
            dialer.mechanism = _mechanism(cfg, lst.name)
            if not cfg.inter_broker_user or cfg.inter_broker_password is None:
                raise ValueError(f"the inter-broker listener {lst.name} is {lst.protocol}: brokers need a login "
                                 f"(--inter-broker-user and --inter-broker-password-env or -file)")
            dialer.username, dialer.password = cfg.inter_broker_user, cfg.inter_broker_password
        return dialer

    @property
    def principal(self) -> str | None:
        """The principal peers see this broker as (None: ANONYMOUS or a certificate's subject)."""
        return f"User:{self.username}" if self.username else None

    async def connect(self, info: BrokerInfo, client_id: str, max_frame: int = 128 * 1024 * 1024) -> PeerConnection:
        """A connection to broker `info` (a BrokerInfo), logged in; OSError, asyncio.TimeoutError,
        PeerError or PeerAuthError otherwise."""
        addr = info.address(self.listener)
        if addr is None:
            # Brokers configured with different listener names: no retry will help soon.
            raise self.refused(info.node_id, f"it registered no listener named {self.listener}")
        host, port = addr
        try:
            frames = await open_frames(host, port, max_frame, self.timeout_s, self.ssl_context,
                                       host if self.ssl_context else None)
        except ssl.SSLError as exc:   # the peer's certificate not accepted, or ours refused
            raise self.refused(info.node_id, f"TLS to {host}:{port}: {exc.reason or exc}") from None
        conn = PeerConnection(frames, client_id)
        if self.mechanism:
            try:
                await conn.login(self.mechanism, self.username or "", self.password or "", self.timeout_s)
            except PeerAuthError as exc:
                conn.close()
                raise self.refused(info.node_id, str(exc)) from None
            except BaseException:
                conn.close()
                raise
        return conn

    def refused(self, node_id: int, why: str) -> PeerAuthError:
        """The error for a peer we cannot use as configured (it refused the login, the
        certificate or ClusterAction, or lacks the listener), logged as a warning at most
        once a minute per peer: every retry fails the same way until someone fixes it."""
        now = time.monotonic()
        if now - self._warned.get(node_id, -1e9) >= 60:
            self._warned[node_id] = now
            log.warning("cannot use broker %d as inter-broker peer (login %s): %s", node_id,
                        self.username or "none", why)
        return PeerAuthError(why)


def _client_tls(cfg: PeerSecurity, listener: str) -> ssl.SSLContext:
    """TLS to peers: their certificate must chain to --ssl-cafile and name the host we dial
    (Kafka's default https endpoint identification); ours goes along for listeners that
    want a client certificate (mTLS)."""
    if not cfg.ssl_cafile:
        raise ValueError(f"the inter-broker listener {listener} uses TLS: brokers need --ssl-cafile "
                         f"(the CA that signed the brokers' certificates) to check each other")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cfg.ssl_cafile)
    if cfg.ssl_certfile and cfg.ssl_keyfile:
        ctx.load_cert_chain(cfg.ssl_certfile, cfg.ssl_keyfile)
    return ctx


def _mechanism(cfg: PeerSecurity, listener: str) -> str:
    enabled = [m.upper() for m in cfg.sasl_enabled_mechanisms]
    wanted = cfg.inter_broker_sasl_mechanism
    if wanted is None:
        wanted = next((m for m in _SASL_MECHANISMS if m in enabled), None)
        if wanted is None:
            raise ValueError(f"the inter-broker listener {listener} uses SASL but no mechanism is enabled")
    wanted = wanted.upper()
    if wanted not in _SASL_MECHANISMS:
        raise ValueError(f"unknown inter-broker SASL mechanism {wanted!r} (one of {', '.join(_SASL_MECHANISMS)})")
    if wanted not in enabled:
        raise ValueError(f"inter-broker SASL mechanism {wanted} is not enabled (--sasl-mechanisms "
                         f"{','.join(enabled)})")
    return wanted


def _uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 28:
            raise PeerError("bad varint in a response header")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _skip_tagged(buf: memoryview, pos: int) -> int:
    """Position after the tagged fields of a flexible response header."""
    count, pos = _uvarint(buf, pos)
    for _ in range(count):
        _, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        pos += size
    return pos

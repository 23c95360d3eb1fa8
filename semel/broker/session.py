"""One client connection's state, which the connection loop (semel.broker.connection)
keeps and every request's RequestContext carries."""
from __future__ import annotations

import asyncio
import time

from .auth.sasl import SaslSession
from .config import Listener
from .frame_reader import FrameReader


class Connection:
    """One client connection's state. `principal` and `session` are where the
    security layer keeps who authenticated and its SASL exchange (None: not yet);
    the router's RequestContext carries this object as `connection`."""
    __slots__ = ("peer", "ip", "transport", "decoder", "last_active", "principal", "session", "listener",
                 "closing")

    def __init__(self, peer: str, ip: str, transport: asyncio.Transport, decoder: FrameReader):
        self.peer = peer
        self.ip = ip
        self.transport = transport
        self.decoder = decoder
        self.last_active = time.monotonic()
        self.principal: str | None = None
        self.session: SaslSession | None = None
        self.listener: Listener | None = None    # the one it came on (None: the default PLAINTEXT one)
        self.closing = False    # set by a handler: close once this response is written (failed SASL)

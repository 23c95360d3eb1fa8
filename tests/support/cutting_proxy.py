"""A TCP proxy in front of one broker that breaks connections mid-request.

Each client connection is relayed one request at a time: a request frame is read
from the client and forwarded, the broker's answer is read and passed back. For a
request the plan picks, the answer is read from the broker (so the request has been
carried out) and then dropped, and both ends are closed: the client sees its
connection break after sending and before any answer, the case a resend must handle.

The broker advertises the proxy's address (`--advertised-host` of a second loopback
address on the broker's port), so every connection a client opens after bootstrap
goes through the proxy too.
"""
from __future__ import annotations

import socket
import struct
import threading
from collections import Counter

from tests.support.wire import recv_frame


def _read_frame(s: socket.socket) -> bytes | None:
    """One size-prefixed frame, its size included (None at the end of the stream)."""
    body = recv_frame(s)
    return None if body is None else struct.pack(">i", len(body)) + body


class CuttingProxy:
    """Listens on (host, port), relays to `target` ("host:port"). cut(*api_keys, every)
    arms it: of the requests with each of those api keys, the 1st, (1 + every)th, ...
    are cut (every=2: one in two, so each resend of a cut request goes through)."""

    def __init__(self, host: str, port: int, target: str):
        th, _, tp = target.rpartition(":")
        self.target = (th, int(tp))
        self.server = socket.create_server((host, port))
        self.lock = threading.Lock()
        self.plan: dict[int, int] = {}
        self.seen: Counter = Counter()   # requests of each planned api key relayed or cut
        self.cuts: Counter = Counter()   # requests of each api key cut
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self, *api_keys: int, every: int = 2) -> None:
        with self.lock:
            self.plan = {k: every for k in api_keys}
            self.seen.clear()
            self.cuts.clear()

    def disarm(self) -> None:
        with self.lock:
            self.plan = {}

    def close(self) -> None:
        self._closed = True
        self.server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _cutting(self, api_key: int) -> bool:
        with self.lock:
            every = self.plan.get(api_key)
            if every is None:
                return False
            n = self.seen[api_key]
            self.seen[api_key] += 1
            if n % every:
                return False
            self.cuts[api_key] += 1
            return True

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        try:
            while True:
                request = _read_frame(client)
                if request is None:
                    return
                api_key = struct.unpack(">h", request[4:6])[0]
                cut = self._cutting(api_key)
                upstream.sendall(request)
                answer = _read_frame(upstream)
                if answer is None or cut:
                    return   # carried out by the broker, never answered to the client
                client.sendall(answer)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()

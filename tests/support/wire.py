"""Raw-socket helpers for tests that speak bytes to a broker."""
from __future__ import annotations

import socket
import struct

from semel.protocol.messages import decode_response, encode_request, request_class


def connect(bootstrap: str, timeout: float = 5.0) -> socket.socket:
    host, port = bootstrap.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except (ConnectionResetError, socket.timeout):
            return None
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> bytes | None:
    head = recv_exact(sock, 4)
    if head is None:
        return None
    return recv_exact(sock, struct.unpack(">i", head)[0])


def closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def call(sock: socket.socket, api_key: int, version: int, corr: int = 1, **fields):
    body = request_class(api_key)(version=version, **fields)
    sock.sendall(encode_request(api_key, version, corr, "test", body))
    frame = recv_frame(sock)
    if frame is None:
        return None
    return decode_response(api_key, version, frame)[1]


def request_bytes(api_key: int, version: int, corr: int = 1, **fields) -> bytes:
    body = request_class(api_key)(version=version, **fields)
    return encode_request(api_key, version, corr, "test", body)


def served_versions(bootstrap: str) -> dict[int, tuple[int, int]]:
    """api key -> (min, max) version, as the broker's ApiVersions (v3) advertises them."""
    with connect(bootstrap) as s:
        r = call(s, 18, 3, client_software_name="t", client_software_version="1")
    return {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}

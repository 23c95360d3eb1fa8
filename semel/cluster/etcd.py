"""A small async client for etcd v3 over its JSON gateway.

The gateway maps etcd's gRPC API onto HTTP POST with JSON bodies: keys and
values travel base64-encoded, 64-bit integers come back as strings, and fields
at their default (0, false, PUT) are left out. Only what the control plane needs
is here: range, put, delete, compare-and-set transactions, leases and a
streaming watch. Every call tries the endpoints in turn, so a client survives
one etcd member going away.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Sequence

if TYPE_CHECKING:
    import aiohttp

# A JSON object as etcd's gateway takes and answers it (decoded by json: of any shape).
Json = dict[str, Any]


log = logging.getLogger("semel.cluster.etcd")


class EtcdError(ConnectionError):
    """etcd could not be reached on any endpoint, or answered with an error."""


@dataclass(frozen=True)
class KV:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int = 0


@dataclass(frozen=True)
class WatchEvent:
    kind: str          # "PUT" or "DELETE"
    kv: KV


def b64(s: str | bytes) -> str:
    """A key or value as the etcd JSON gateway takes it: base64 of its bytes (UTF-8 for a str)."""
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def prefix_end(prefix: str) -> str:
    """The range end covering every key that starts with `prefix` (etcd's convention)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1      # prefixes here end in "/", never 0xff
    return b64(bytes(raw))


def _kv(d: Json) -> KV:
    return KV(key=base64.b64decode(d["key"]).decode(), value=base64.b64decode(d.get("value", "")),
              mod_revision=int(d.get("mod_revision", 0)), create_revision=int(d.get("create_revision", 0)),
              lease=int(d.get("lease", 0)))


def put_op(key: str, value: bytes, lease: int = 0) -> Json:
    op = {"key": b64(key), "value": b64(value)}
    if lease:
        op["lease"] = str(lease)
    return {"request_put": op}


def delete_op(key: str) -> Json:
    """A transaction operation deleting one key."""
    return {"request_delete_range": {"key": b64(key)}}


def delete_prefix_op(prefix: str) -> Json:
    """A transaction operation deleting every key under prefix."""
    return {"request_delete_range": {"key": b64(prefix), "range_end": prefix_end(prefix)}}


def mod_equals(key: str, mod_revision: int) -> Json:
    """Compare: the key's mod_revision is still this (0 = the key does not exist)."""
    if mod_revision == 0:
        return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}


class Etcd:
    """One aiohttp session over a list of endpoints ("http://host:port")."""

    def __init__(self, endpoints: list[str] | str, timeout_s: float = 5.0):
        if isinstance(endpoints, str):
            endpoints = parse_endpoints(endpoints)
        if not endpoints:
            raise ValueError("no etcd endpoints given")
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            import aiohttp   # the cluster extra; the single-node broker never imports it
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, path: str, body: Json, timeout_s: float | None = None) -> Json:
        """POST to the first endpoint that answers; EtcdError when none does. `timeout_s`
        per endpoint (default: the client's): a lease keepalive must give up well within
        the lease, or one lost request would outlast it."""
        import aiohttp
        session = await self._http()
        last: Exception | None = None
        for i, ep in enumerate(self.endpoints):
            try:
                async with session.post(ep + path, json=body,
                                        timeout=aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)) as resp:
                    data: Json = await resp.json(content_type=None)
                    if resp.status != 200 or "error" in data or "code" in data:
                        raise EtcdError(f"etcd {path}: {data.get('message') or data.get('error') or resp.status}")
                    if i:   # remember the endpoint that works
                        self.endpoints.insert(0, self.endpoints.pop(i))
                    return data
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                last = exc
        raise EtcdError(f"no etcd endpoint answered {path} ({', '.join(self.endpoints)}): {last or type(last).__name__}")

    # --- keys ----------------------------------------------------------------

    async def get(self, key: str) -> KV | None:
        data = await self.call("/v3/kv/range", {"key": b64(key)})
        kvs = data.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KV], int]:
        """Every key under prefix and the store revision they were read at."""
        data = await self.call("/v3/kv/range", {"key": b64(prefix), "range_end": prefix_end(prefix)})
        return [_kv(d) for d in data.get("kvs") or []], int(data["header"]["revision"])

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        data = await self.call("/v3/kv/put", put_op(key, value, lease)["request_put"])
        return int(data["header"]["revision"])

    async def delete(self, key: str) -> None:
        await self.call("/v3/kv/deleterange", {"key": b64(key)})

    async def txn(self, compare: list[Json], success: list[Json], failure: Sequence[Json] = ()) -> tuple[bool, int]:
        """(succeeded, revision after): with one put in success, that revision is the
        key's new mod_revision."""
        data = await self.call("/v3/kv/txn", {"compare": compare, "success": success, "failure": list(failure)})
        return bool(data.get("succeeded")), int(data["header"]["revision"])

    async def cas(self, key: str, value: bytes, mod_revision: int, lease: int = 0) -> int | None:
        """Write key if its mod_revision is still `mod_revision` (0: only if absent).
        The new mod_revision, or None when someone else wrote first."""
        ok, rev = await self.txn([mod_equals(key, mod_revision)], [put_op(key, value, lease)])
        return rev if ok else None

    # --- leases --------------------------------------------------------------

    async def lease_grant(self, ttl_s: int, timeout_s: float | None = None) -> int:
        data = await self.call("/v3/lease/grant", {"TTL": str(ttl_s)}, timeout_s)
        return int(data["ID"])

    async def lease_keepalive(self, lease_id: int, timeout_s: float | None = None) -> int:
        """Refresh a lease; its remaining TTL, 0 when it has already expired."""
        data = await self.call("/v3/lease/keepalive", {"ID": str(lease_id)}, timeout_s)
        return int((data.get("result") or {}).get("TTL", 0))

    async def lease_granted_ttl(self, lease_id: int) -> int:
        """The TTL a lease was granted with (-1 once it has expired)."""
        data = await self.call("/v3/lease/timetolive", {"ID": str(lease_id)})
        return int(data.get("grantedTTL", -1)) if int(data.get("TTL", -1)) >= 0 else -1

    async def lease_revoke(self, lease_id: int) -> None:
        try:
            await self.call("/v3/lease/revoke", {"ID": str(lease_id)})
        except EtcdError as exc:   # already expired: nothing left to revoke
            if "not found" not in str(exc):
                raise

    # --- watch ---------------------------------------------------------------

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        """Batches of events under prefix from start_revision on, until the stream ends
        (the caller re-reads and watches again: compaction or a lost endpoint end it)."""
        import aiohttp
        session = await self._http()
        body = {"create_request": {"key": b64(prefix), "range_end": prefix_end(prefix),
                                   "start_revision": str(start_revision)}}
        async with session.post(self.endpoints[0] + "/v3/watch", json=body,
                                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s)) as resp:
            async for line in _json_lines(resp.content):
                result = line.get("result") or {}
                if "error" in line or result.get("canceled") or result.get("compact_revision"):
                    raise EtcdError(f"watch on {prefix} ended: {line}")
                events = [WatchEvent(e.get("type", "PUT"), _kv(e["kv"])) for e in result.get("events") or []]
                if events:
                    yield events


async def _json_lines(stream: aiohttp.StreamReader) -> AsyncIterator[Json]:
    """The gateway writes one JSON object per message, newline-separated."""
    buf = b""
    async for chunk in stream.iter_any():
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
    if buf.strip():
        yield json.loads(buf)


def parse_endpoints(spec: str) -> list[str]:
    """"host:port,host:port" or full URLs -> ["http://host:port", ...]; ValueError on junk."""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        url = part if "://" in part else "http://" + part
        scheme, _, hostport = url.partition("://")
        host, colon, port = hostport.rstrip("/").rpartition(":")
        if scheme not in ("http", "https") or not colon or not host or not port.isdigit():
            raise ValueError(f"metadata endpoint {part!r} is not HOST:PORT or http://HOST:PORT")
        out.append(f"{scheme}://{host}:{port}")
    if not out:
        raise ValueError("no metadata endpoints given")
    return out

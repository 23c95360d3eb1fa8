"""An in-memory etcd for model tests of the control plane's read-decide-CAS paths.

It speaks the subset of semel.cluster.etcd.Etcd that EtcdClusterView's writers use
(get, get_prefix, put, txn with MOD/CREATE compares and put/delete-range operations,
cas) with etcd's semantics: one store revision per write transaction, a missing key
compares as revision 0. Every call yields to the event loop a seeded random number of
times before it reads or writes, so concurrent callers interleave differently per seed.
Committed events are kept in order (`events`) for views that follow them like a watch,
and `on_commit` runs after every write so a test can check its invariants there.
"""
from __future__ import annotations

import asyncio
import base64
import random
from typing import Callable

from semel.cluster.etcd import KV, WatchEvent


def _unb64(s: str) -> str:
    return base64.b64decode(s).decode()


class FakeEtcd:
    def __init__(self, rng: random.Random, on_commit: Callable[[], None] = lambda: None):
        self.rng = rng
        self.on_commit = on_commit
        self.revision = 1
        self.kvs: dict[str, KV] = {}
        self.events: list[WatchEvent] = []

    async def _yield(self) -> None:
        for _ in range(self.rng.randint(0, 4)):
            await asyncio.sleep(0)

    async def close(self) -> None:
        pass

    async def get(self, key: str) -> KV | None:
        await self._yield()
        return self.kvs.get(key)

    async def get_prefix(self, prefix: str) -> tuple[list[KV], int]:
        await self._yield()
        return sorted((kv for k, kv in self.kvs.items() if k.startswith(prefix)), key=lambda kv: kv.key), self.revision

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        ok, rev = await self.txn([], [{"request_put": {"key": base64.b64encode(key.encode()).decode(),
                                                       "value": base64.b64encode(value).decode()}}])
        return rev

    async def cas(self, key: str, value: bytes, mod_revision: int, lease: int = 0) -> int | None:
        from semel.cluster.etcd import mod_equals, put_op
        ok, rev = await self.txn([mod_equals(key, mod_revision)], [put_op(key, value)])
        return rev if ok else None

    async def txn(self, compare: list[dict], success: list[dict], failure: list[dict] = ()) -> tuple[bool, int]:
        await self._yield()
        ok = all(self._holds(c) for c in compare)
        ops = success if ok else list(failure)
        if any("request_put" in op or "request_delete_range" in op for op in ops):
            self.revision += 1
            for op in ops:
                self._apply(op)
            self.on_commit()
        revision = self.revision      # this transaction's, whatever commits while we yield
        await self._yield()
        return ok, revision

    def _holds(self, c: dict) -> bool:
        kv = self.kvs.get(_unb64(c["key"]))
        if c["target"] == "CREATE":
            return (kv.create_revision if kv else 0) == int(c["create_revision"])
        return (kv.mod_revision if kv else 0) == int(c["mod_revision"])

    def _apply(self, op: dict) -> None:
        if "request_put" in op:
            p = op["request_put"]
            key = _unb64(p["key"])
            old = self.kvs.get(key)
            kv = KV(key, base64.b64decode(p["value"]), self.revision, old.create_revision if old else self.revision)
            self.kvs[key] = kv
            self.events.append(WatchEvent("PUT", kv))
        else:
            d = op["request_delete_range"]
            start, end = _unb64(d["key"]), _unb64(d["range_end"])
            for key in sorted(k for k in self.kvs if start <= k < end):
                del self.kvs[key]
                self.events.append(WatchEvent("DELETE", KV(key, b"", self.revision, 0)))

    # Leases, for the view's session: granted and kept alive while `reachable`; a
    # keepalive of a lease the test marked expired answers 0, as etcd does.
    reachable = True
    expired: set = set()
    _next_lease = 0x100

    def _reach(self) -> None:
        from semel.cluster.etcd import EtcdError
        if not self.reachable:
            raise EtcdError("no etcd endpoint answered (fake etcd cut off)")

    async def lease_grant(self, ttl_s: int, timeout_s=None) -> int:
        await self._yield()
        self._reach()
        self._next_lease += 1
        return self._next_lease

    async def lease_keepalive(self, lease_id: int, timeout_s=None) -> int:
        await self._yield()
        self._reach()
        return 0 if lease_id in self.expired else 3

    async def lease_revoke(self, lease_id: int) -> None:
        self.expired = self.expired | {lease_id}

    async def watch_prefix(self, prefix: str, start_revision: int):
        """A watch that delivers nothing (the tests read the cache after their own writes)."""
        await asyncio.Event().wait()
        yield []

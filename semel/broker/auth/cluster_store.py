"""Users and ACLs of a cluster, kept in etcd so every broker checks the same ones.

A single node keeps them in files under its data dir (users.py, acl.py); in a cluster
`semel user|acl --metadata`, CreateAcls and DeleteAcls on any broker write here, and
every broker's view (EtcdClusterView.key_cache) follows the keys through its watch, so
a change applies on all brokers without a restart (a deleted user fails its next login
or re-authentication everywhere). Keys under /semel/<cluster-id>/:

  users/<name>                      {mechanism: {salt, stored_key, server_key, iterations}}
                                    SCRAM salted credentials only, never a password
  acls/<TYPE>/<PATTERN>/<resource>  [{principal, host, operation, permission}, ...]
                                    the ACLs of one resource (Kafka's per-resource layout),
                                    changed only by compare-and-set on the key's version
"""
from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Callable, Iterable, TypedDict, cast

from ...cluster.etcd import Etcd, Json, b64, mod_equals, put_op
from ...cluster.keys import DEFAULT_CLUSTER_ID, Keys, KeyCache
from .acl import AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType
from .users import MECHANISMS, CredentialReader, Credentials, Users, altered, make_credentials

if TYPE_CHECKING:
    from ...cluster.metadata import EtcdClusterView

USERS, ACLS = "users/", "acls/"


class AclEntry(TypedDict):
    """One binding of a resource as stored under its acls/ key."""
    principal: str
    host: str
    operation: int
    permission: int


# on_write(subtree, name, value, revision), value None: deleted
OnWrite = Callable[[str, str, object, int], None]


def acl_key(b: AclBinding) -> str:
    return f"{b.resource_type.name}/{b.pattern.name}/{b.name}"


def _entry(b: AclBinding) -> AclEntry:
    return {"principal": b.principal, "host": b.host, "operation": int(b.operation),
            "permission": int(b.permission)}


def bindings_of(key: str, entries: list[AclEntry]) -> list[AclBinding]:
    """The bindings stored under acls/<key> (the resource name may hold '/')."""
    rtype, pattern, name = key.split("/", 2)
    return [AclBinding(ResourceType[rtype], name, PatternType[pattern], e["principal"], e["host"],
                       Operation(e["operation"]), Permission(e["permission"])) for e in entries]


class EtcdSecurity:
    """Reads and writes of one cluster's users and ACLs. `on_write(subtree, name, value,
    revision)` (value None: deleted) lets a broker's caches see its own write at once."""

    def __init__(self, etcd: Etcd, cluster_id: str, on_write: OnWrite | None = None):
        self.etcd = etcd
        self.root = Keys(cluster_id).root
        self.on_write: OnWrite = on_write or (lambda *a: None)

    # --- users ----------------------------------------------------------------------

    async def put_user(self, name: str, password: str, mechanisms: Iterable[str] = MECHANISMS) -> None:
        """A new user or a new password: the salted credentials replace the old ones."""
        creds = make_credentials(name, password, mechanisms)
        rev = await self.etcd.put(self.root + USERS + name, json.dumps(creds).encode())
        self.on_write(USERS, name, creds, rev)

    async def delete_user(self, name: str) -> bool:
        ok, rev = await self.etcd.txn([{"key": b64(self.root + USERS + name), "target": "CREATE",
                                        "result": "GREATER", "create_revision": "0"}],
                                      [_delete_op(self.root + USERS + name)])
        if ok:
            self.on_write(USERS, name, None, rev)
        return ok

    async def alter_user(self, name: str, upserts: Credentials, deletes: set[str]) -> str | None:
        """Change some of a user's mechanisms by compare-and-set on its key (decided again
        on what won if another change came first); the error message, or None."""
        key = self.root + USERS + name
        while True:
            kv = await self.etcd.get(key)
            new, err = altered(json.loads(kv.value) if kv is not None else None, upserts, deletes)
            if err:
                return err
            version = kv.mod_revision if kv is not None else 0
            op = put_op(key, json.dumps(new).encode()) if new is not None else _delete_op(key)
            ok, rev = await self.etcd.txn([mod_equals(key, version)], [op])
            if ok:
                self.on_write(USERS, name, new, rev)
                return None

    async def users(self) -> Users:
        kvs, _ = await self.etcd.get_prefix(self.root + USERS)
        return {kv.key[len(self.root + USERS):]: json.loads(kv.value) for kv in kvs}

    # --- ACLs -----------------------------------------------------------------------

    async def add_acls(self, bindings: list[AclBinding]) -> None:
        for b in bindings:
            b.validate()
        by_key: dict[str, list[AclEntry]] = {}
        for b in bindings:
            by_key.setdefault(acl_key(b), []).append(_entry(b))
        for key, new in by_key.items():
            def merged(cur: list[AclEntry], new: list[AclEntry] = new) -> list[AclEntry]:
                return cur + [e for e in new if e not in cur]
            await self._change(key, merged)

    async def remove_acls(self, filt: AclFilter) -> list[AclBinding]:
        """Deletes and returns the bindings the filter matches (each resource by CAS)."""
        kvs, _ = await self.etcd.get_prefix(self.root + ACLS)
        gone: list[AclBinding] = []
        for kv in kvs:
            key = kv.key[len(self.root + ACLS):]
            if any(filt.matches(b) for b in bindings_of(key, json.loads(kv.value))):
                def keep(cur: list[AclEntry], key: str = key) -> list[AclEntry]:
                    return [e for e, b in zip(cur, bindings_of(key, cur)) if not filt.matches(b)]
                before = await self._change(key, keep)
                gone += [b for b in bindings_of(key, before) if filt.matches(b)]
        return gone

    async def acls(self) -> list[AclBinding]:
        kvs, _ = await self.etcd.get_prefix(self.root + ACLS)
        return [b for kv in kvs for b in bindings_of(kv.key[len(self.root + ACLS):], json.loads(kv.value))]

    async def _change(self, key: str, change: Callable[[list[AclEntry]], list[AclEntry]]) -> list[AclEntry]:
        """Read the resource's ACLs, change them, write by compare-and-set on the version
        read (an empty list deletes the key); decided again on what won if it lost. The
        entries the written change was decided from (unchanged: [])."""
        full = self.root + ACLS + key
        while True:
            kv = await self.etcd.get(full)
            cur: list[AclEntry] = json.loads(kv.value) if kv is not None else []
            new = change(list(cur))
            if new == cur:
                return []
            version = kv.mod_revision if kv is not None else 0
            op = put_op(full, json.dumps(new).encode()) if new else _delete_op(full)
            ok, rev = await self.etcd.txn([mod_equals(full, version)], [op])
            if ok:
                self.on_write(ACLS, key, new or None, rev)
                return cur


def _delete_op(key: str) -> Json:
    return {"request_delete_range": {"key": b64(key)}}


class ClusterUserStore(CredentialReader):
    """A broker's users in a cluster: read from the view's cache of users/."""

    def __init__(self, cache: KeyCache, writer: EtcdSecurity):
        self.cache, self.writer = cache, writer

    def _users(self) -> Users:
        return self.credentials()

    def credentials(self) -> Users:
        # the cache holds the decoded JSON of the users/ keys
        return cast(Users, self.cache.items)

    async def alter(self, changes: dict[str, tuple[Credentials, set[str]]]) -> dict[str, str | None]:
        return {name: await self.writer.alter_user(name, upserts, deletes)
                for name, (upserts, deletes) in changes.items()}


class ClusterAclStore:
    """A broker's ACLs in a cluster, read from the view's cache of acls/: `bindings()` is
    a new list once per change (the Authorizer keeps its decisions per list)."""

    def __init__(self, cache: KeyCache, writer: EtcdSecurity):
        self.cache, self.writer = cache, writer
        self._built: tuple[int, list[AclBinding]] = (-1, [])

    def bindings(self) -> list[AclBinding]:
        if self._built[0] != self.cache.version:
            # the cache holds the decoded JSON of the acls/ keys
            items = cast(dict[str, list[AclEntry]], self.cache.items)
            self._built = (self.cache.version,
                           [b for key, entries in sorted(items.items()) for b in bindings_of(key, entries)])
        return self._built[1]

    def describe(self, filt: AclFilter) -> list[AclBinding]:
        return [b for b in self.bindings() if filt.matches(b)]

    async def create(self, bindings: list[AclBinding]) -> None:
        await self.writer.add_acls(bindings)

    async def delete(self, filt: AclFilter) -> list[AclBinding]:
        return await self.writer.remove_acls(filt)


def cluster_stores(view: EtcdClusterView) -> tuple[ClusterUserStore, ClusterAclStore]:
    """The stores of a broker in the cluster `view` (before view.start(), so its first
    read fills them); its own writes reach its caches before they are answered."""
    users, acls = view.key_cache(USERS), view.key_cache(ACLS)
    caches = {USERS: users, ACLS: acls}

    def seen(subtree: str, name: str, value: object, revision: int) -> None:
        if value is None:
            caches[subtree].drop(name, revision)
        else:
            caches[subtree].put(name, value, revision)

    writer = EtcdSecurity(view.etcd, view.keys.root.split("/")[2], seen)
    return ClusterUserStore(users, writer), ClusterAclStore(acls, writer)


def save_users(endpoint: str, users: dict[str, str], cluster_id: str = DEFAULT_CLUSTER_ID) -> None:
    """SCRAM users (name -> password) in the etcd at `endpoint`, where every broker of
    the cluster checks logins; blocks until they are written."""
    async def save() -> None:
        sec = EtcdSecurity(Etcd(endpoint), cluster_id)
        try:
            for name, password in users.items():
                await sec.put_user(name, password)
        finally:
            await sec.etcd.close()
    if users:
        asyncio.run(save())

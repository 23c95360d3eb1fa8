"""Kafka's ACL model, a durable ACL store and the authorizer.

An ACL binding: (resource type, resource name, pattern type) x (principal, host,
operation, permission). Numbers are Kafka's wire enums (CreateAcls & co carry them).
Decision (Kafka's AclAuthorizer): super users may do anything; otherwise the ACLs
matching the resource (literal name, literal "*", prefixed names that start the
resource's name) decide: any matching DENY wins, else a matching ALLOW grants; a
resource with no ACL at all is allowed only with allow_everyone_if_no_acl_found.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any, Protocol

from .store import JsonStore

FILE_NAME = "__acls.json"


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
ANONYMOUS = "User:ANONYMOUS"

# An ALLOW of the key also grants these (Kafka: Describe is implied by Read, Write,
# Delete and Alter; DescribeConfigs by AlterConfigs).
_IMPLIED_BY = {
    Operation.DESCRIBE: {Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER},
    Operation.DESCRIBE_CONFIGS: {Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS},
}
# Operations that make sense per resource type (Kafka rejects the others in CreateAcls).
VALID_OPERATIONS = {
    ResourceType.TOPIC: {Operation.ALL, Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE,
                         Operation.ALTER, Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS},
    ResourceType.GROUP: {Operation.ALL, Operation.READ, Operation.DELETE, Operation.DESCRIBE},
    ResourceType.CLUSTER: {Operation.ALL, Operation.CREATE, Operation.ALTER, Operation.DESCRIBE,
                           Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
                           Operation.IDEMPOTENT_WRITE},
    ResourceType.TRANSACTIONAL_ID: {Operation.ALL, Operation.WRITE, Operation.DESCRIBE},
}


class InvalidAcl(ValueError):
    """A binding Kafka would refuse (INVALID_REQUEST on the wire, one line in the CLI)."""


@dataclass(frozen=True, slots=True)
class AclBinding:
    resource_type: ResourceType
    name: str
    pattern: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def validate(self) -> "AclBinding":
        if self.resource_type not in VALID_OPERATIONS:
            raise InvalidAcl("resource type must be one of topic, group, cluster, transactional-id")
        if self.pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAcl("pattern type must be literal or prefixed")
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            raise InvalidAcl("permission must be allow or deny")
        if self.operation not in VALID_OPERATIONS[self.resource_type]:
            raise InvalidAcl(f"operation {self.operation.name} does not apply to {self.resource_type.name}")
        if not self.name:
            raise InvalidAcl("resource name must not be empty")
        if self.resource_type is ResourceType.CLUSTER and self.name != CLUSTER_NAME:
            raise InvalidAcl(f"the cluster resource is named {CLUSTER_NAME!r}")
        if not self.principal or ":" not in self.principal or self.principal.endswith(":"):
            raise InvalidAcl(f"principal must look like User:NAME, got {self.principal!r}")
        if not self.host:
            raise InvalidAcl("host must not be empty (use * for any)")
        return self

    def to_json(self) -> dict[str, Any]:
        return {k: int(v) if isinstance(v, IntEnum) else v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "AclBinding":
        return cls(ResourceType(d["resource_type"]), d["name"], PatternType(d["pattern"]), d["principal"],
                   d["host"], Operation(d["operation"]), Permission(d["permission"]))

    def matches_resource(self, rtype: ResourceType, name: str) -> bool:
        if self.resource_type != rtype:
            return False
        if self.pattern is PatternType.LITERAL:
            return self.name == name or self.name == WILDCARD
        return name.startswith(self.name)


@dataclass(frozen=True, slots=True)
class AclFilter:
    """DescribeAcls / DeleteAcls filter: None or ANY matches everything."""
    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type is not ResourceType.ANY and b.resource_type != self.resource_type:
            return False
        if not self._name_matches(b):
            return False
        return ((self.principal is None or self.principal == b.principal)
                and (self.host is None or self.host == b.host)
                and (self.operation is Operation.ANY or self.operation == b.operation)
                and (self.permission is Permission.ANY or self.permission == b.permission))

    def _name_matches(self, b: AclBinding) -> bool:
        if self.pattern is PatternType.MATCH:
            return self.name is None or b.matches_resource(b.resource_type, self.name)
        if self.pattern is not PatternType.ANY and b.pattern != self.pattern:
            return False
        return self.name is None or self.name == b.name


class AclStore:
    def __init__(self, data_dir: Path):
        self.store = JsonStore(Path(data_dir) / FILE_NAME, list,
                               check=lambda doc: [AclBinding.from_json(d) for d in doc])
        self._cache: tuple[object, list[AclBinding]] = (None, [])

    def bindings(self) -> list[AclBinding]:
        """A new list object after each change of the file (Authorizer's decisions key
        on it). The document itself is kept for the identity test: an id() of a freed
        document can be reused by the next one."""
        doc = self.store.read()
        if self._cache[0] is not doc:   # parse once per change of the file
            self._cache = (doc, [AclBinding.from_json(d) for d in doc])
        return self._cache[1]

    def add(self, bindings: list[AclBinding]) -> None:
        for b in bindings:
            b.validate()
        with self.store.update() as doc:
            have = {AclBinding.from_json(d) for d in doc}
            doc.extend(b.to_json() for b in bindings if b not in have)

    def remove(self, filt: AclFilter) -> list[AclBinding]:
        """Deletes and returns the bindings the filter matches."""
        with self.store.update() as doc:
            all_ = [AclBinding.from_json(d) for d in doc]
            gone = [b for b in all_ if filt.matches(b)]
            doc[:] = [b.to_json() for b in all_ if not filt.matches(b)]
        return gone

    def describe(self, filt: AclFilter) -> list[AclBinding]:
        return [b for b in self.bindings() if filt.matches(b)]

    # CreateAcls / DeleteAcls await these: a cluster's store writes to etcd
    # (cluster_store.ClusterAclStore).
    async def create(self, bindings: list[AclBinding]) -> None:
        self.add(bindings)

    async def delete(self, filt: AclFilter) -> list[AclBinding]:
        return self.remove(filt)


MAX_CACHED_DECISIONS = 10_000


class AclSource(Protocol):
    """Where the authorizer reads bindings: AclStore, or a cluster's ClusterAclStore."""

    def bindings(self) -> list[AclBinding]: ...


class Authorizer:
    """`enabled` False: everyone may do everything (a broker without security)."""

    def __init__(self, store: AclSource, enabled: bool, super_users: set[str], allow_if_no_acl: bool):
        self.store = store
        self.enabled = enabled
        self.super_users = super_users
        self.allow_if_no_acl = allow_if_no_acl
        # Decisions per (principal, host, op, type, name), valid for one version of the
        # ACL list (store.bindings() returns a new list when the file changed). Every
        # Produce and Fetch asks again; scanning a few hundred bindings each time cost
        # ~70 us a request (bench/security.py).
        self._decided_for: list[AclBinding] | None = None
        self._decided_allow: bool | None = None
        self._decisions: dict[tuple[str, str, Operation, ResourceType, str], bool] = {}

    def authorize(self, principal: str, host: str, op: Operation, rtype: ResourceType, name: str) -> bool:
        if not self.enabled or principal in self.super_users:
            return True
        bindings = self.store.bindings()
        if bindings is not self._decided_for or self.allow_if_no_acl is not self._decided_allow:
            self._decided_for, self._decided_allow, self._decisions = bindings, self.allow_if_no_acl, {}
        key = (principal, host, op, rtype, name)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._decide(bindings, principal, host, op, rtype, name)
            if len(self._decisions) >= MAX_CACHED_DECISIONS:   # bound memory: names come from clients
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def _decide(self, bindings: list[AclBinding], principal: str, host: str, op: Operation, rtype: ResourceType,
                name: str) -> bool:
        matching = [b for b in bindings if b.matches_resource(rtype, name)]
        if not matching:
            return self.allow_if_no_acl
        mine = [b for b in matching if b.principal in (principal, "User:*") and b.host in (host, WILDCARD)]
        if any(b.permission is Permission.DENY and b.operation in (op, Operation.ALL) for b in mine):
            return False
        granting = _IMPLIED_BY.get(op, {op}) | {Operation.ALL}
        return any(b.permission is Permission.ALLOW and b.operation in granting for b in mine)

    def authorize_any(self, principal: str, host: str, op: Operation, rtype: ResourceType) -> bool:
        """Is `op` allowed on SOME resource of the type (Kafka: IdempotentWrite is
        also granted by Write on any transactional id)? Prefixed/literal ALLOWs not
        shadowed by a DENY of the same pattern count."""
        if not self.enabled or principal in self.super_users:
            return True
        mine = [b for b in self.store.bindings() if b.resource_type == rtype
                and b.principal in (principal, "User:*") and b.host in (host, WILDCARD)]
        return any(b.permission is Permission.ALLOW and b.operation in (op, Operation.ALL)
                   and self.authorize(principal, host, op, rtype, b.name) for b in mine)

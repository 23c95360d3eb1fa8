"""CreateAcls (30), DescribeAcls (29), DeleteAcls (31) over auth.acl.AclStore.
Who may call them (Alter/Describe on the cluster) is checked in auth_gate.py."""
from __future__ import annotations

from typing import Any, TypeVar

from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ..auth.acl import (AclBinding, AclFilter, InvalidAcl, Operation, PatternType, Permission,
                        ResourceType)
from ..router import RequestContext, handler

E = TypeVar("E", ResourceType, PatternType, Operation, Permission)


def _enum(enum: type[E], value: int) -> E:
    try:
        return enum(value)
    except ValueError:
        return enum["UNKNOWN"]


def _binding(c: Any) -> AclBinding:
    return AclBinding(_enum(ResourceType, c.resource_type), c.resource_name or "",
                      _enum(PatternType, getattr(c, "resource_pattern_type", 3)), c.principal or "",
                      c.host or "", _enum(Operation, c.operation), _enum(Permission, c.permission_type))


def _filter(f: Any) -> AclFilter:
    return AclFilter(_enum(ResourceType, f.resource_type_filter), f.resource_name_filter,
                     _enum(PatternType, getattr(f, "pattern_type_filter", 3)), f.principal_filter,
                     f.host_filter, _enum(Operation, f.operation), _enum(Permission, f.permission_type))


@handler(ApiKey.CREATE_ACLS, 0, 3)
async def create_acls(ctx: RequestContext, body: Any) -> Any:
    R = ctx.cls().AclCreationResult
    results = []
    for c in body.creations or []:
        try:
            await ctx.services.acls.create([_binding(c).validate()])
            results.append(R(error_code=KafkaError.NONE, error_message=None))
        except InvalidAcl as exc:
            results.append(R(error_code=KafkaError.INVALID_REQUEST, error_message=str(exc)))
        except ConnectionError as exc:   # a cluster's etcd unreachable: nothing written
            results.append(R(error_code=KafkaError.UNKNOWN_SERVER_ERROR, error_message=f"metadata service: {exc}"))
    return ctx.response(throttle_time_ms=0, results=results)


@handler(ApiKey.DESCRIBE_ACLS, 0, 3)
async def describe_acls(ctx: RequestContext, body: Any) -> Any:
    cls = ctx.cls()
    found = ctx.services.acls.describe(_filter(body))
    grouped: dict[tuple[ResourceType, str, PatternType], list[AclBinding]] = {}
    for b in found:
        grouped.setdefault((b.resource_type, b.name, b.pattern), []).append(b)
    R = cls.DescribeAclsResource
    D = R.AclDescription
    resources = [R(resource_type=rt, resource_name=name, pattern_type=pt,
                   acls=[D(principal=b.principal, host=b.host, operation=b.operation,
                           permission_type=b.permission) for b in bs])
                 for (rt, name, pt), bs in grouped.items()]
    return ctx.response(throttle_time_ms=0, error_code=KafkaError.NONE, error_message=None, resources=resources)


@handler(ApiKey.DELETE_ACLS, 0, 3)
async def delete_acls(ctx: RequestContext, body: Any) -> Any:
    F = ctx.cls().DeleteAclsFilterResult
    M = F.DeleteAclsMatchingAcl
    results = []
    for f in body.filters or []:
        try:
            gone = await ctx.services.acls.delete(_filter(f))
        except ConnectionError as exc:   # a cluster's etcd unreachable (what was removed stays removed)
            results.append(F(error_code=KafkaError.UNKNOWN_SERVER_ERROR, error_message=f"metadata service: {exc}",
                             matching_acls=[]))
            continue
        results.append(F(error_code=KafkaError.NONE, error_message=None, matching_acls=[
            M(error_code=KafkaError.NONE, error_message=None, resource_type=b.resource_type,
              resource_name=b.name, pattern_type=b.pattern, principal=b.principal, host=b.host,
              operation=b.operation, permission_type=b.permission) for b in gone]))
    return ctx.response(throttle_time_ms=0, filter_results=results)

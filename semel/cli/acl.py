"""`semel acl add|list|remove`: Kafka's ACLs in a single node's data dir or, with
--metadata, in a cluster's etcd (the same store CreateAcls/DescribeAcls/DeleteAcls
use; running brokers apply a change on their next check).

    semel acl add --data-dir D --allow User:alice --operation write --topic payments
    semel acl add --data-dir D --deny User:* --operation all --topic tmp- --prefixed
"""
from __future__ import annotations

from .main import CliError
from .security_target import add_target_args, check_data_dir, on_cluster

_RESOURCES = (("topic", "TOPIC"), ("group", "GROUP"), ("transactional_id", "TRANSACTIONAL_ID"))


def add_parser(sub) -> None:
    p = sub.add_parser("acl", help="manage ACLs (Kafka's model)")
    asub = p.add_subparsers(dest="action", metavar="ACTION")
    asub.required = True
    a = asub.add_parser("add", help="add an ACL")
    lst = asub.add_parser("list", help="list ACLs (filters optional)")
    rm = asub.add_parser("remove", help="remove the ACLs matching the filters")
    for sp in (a, lst, rm):
        add_target_args(sp)
        who = sp.add_mutually_exclusive_group(required=sp is a)
        who.add_argument("--allow", metavar="PRINCIPAL", help="User:NAME (User:* for everyone)")
        who.add_argument("--deny", metavar="PRINCIPAL")
        sp.add_argument("--host", default="*" if sp is a else None)
        sp.add_argument("--operation", default="all" if sp is a else None,
                        help="read, write, create, delete, alter, describe, idempotent-write, all, ...")
        res = sp.add_mutually_exclusive_group(required=sp is a)
        res.add_argument("--topic")
        res.add_argument("--group")
        res.add_argument("--transactional-id")
        res.add_argument("--cluster", action="store_true")
        sp.add_argument("--prefixed", action="store_true", help="the name is a prefix (default literal)")
        sp.set_defaults(func=run)


def run(args) -> int:
    from ..broker.auth.acl import AclStore, InvalidAcl
    if args.metadata is None:
        check_data_dir(args)
        store = AclStore(args.data_dir)
        add, remove, listed = store.add, store.remove, lambda filt: store.describe(filt)
    else:
        def add(bindings):
            on_cluster(args, lambda sec: sec.add_acls(bindings))

        def remove(filt):
            return on_cluster(args, lambda sec: sec.remove_acls(filt))

        def listed(filt):
            return [b for b in on_cluster(args, lambda sec: sec.acls()) if filt.matches(b)]
    try:
        if args.action == "add":
            binding = _binding(args)
            add([binding])
            print(f"added {_show(binding)}")
        elif args.action == "remove":
            gone = remove(_filter(args))
            for b in gone:
                print(f"removed {_show(b)}")
            if not gone:
                raise CliError("no ACL matches")
        else:
            for b in listed(_filter(args)):
                print(_show(b))
    except InvalidAcl as exc:
        raise CliError(f"invalid ACL: {exc}") from None
    except (ValueError, OSError) as exc:
        raise CliError(str(exc)) from None
    return 0


def _operation(name: str):
    from ..broker.auth.acl import Operation
    try:
        return Operation[name.strip().upper().replace("-", "_")]
    except KeyError:
        known = ", ".join(o.name.lower().replace("_", "-") for o in Operation if o.value > 1)
        raise CliError(f"unknown operation {name!r} (one of {known})") from None


def _resource(args):
    from ..broker.auth.acl import CLUSTER_NAME, ResourceType
    if getattr(args, "cluster", False):
        return ResourceType.CLUSTER, CLUSTER_NAME
    for attr, kind in _RESOURCES:
        value = getattr(args, attr)
        if value is not None:
            return ResourceType[kind], value
    return ResourceType.ANY, None


def _binding(args):
    from ..broker.auth.acl import AclBinding, PatternType, Permission
    rtype, name = _resource(args)
    principal, permission = (args.allow, Permission.ALLOW) if args.allow else (args.deny, Permission.DENY)
    return AclBinding(rtype, name, PatternType.PREFIXED if args.prefixed else PatternType.LITERAL,
                      principal, args.host, _operation(args.operation), permission).validate()


def _filter(args):
    from ..broker.auth.acl import AclFilter, Operation, PatternType, Permission
    rtype, name = _resource(args)
    principal = args.allow or args.deny
    permission = Permission.ALLOW if args.allow else Permission.DENY if args.deny else Permission.ANY
    pattern = PatternType.PREFIXED if args.prefixed else PatternType.ANY
    op = _operation(args.operation) if args.operation else Operation.ANY
    return AclFilter(rtype, name, pattern, principal, args.host, op, permission)


def _show(b) -> str:
    return (f"{b.permission.name.lower()} {b.principal} {b.operation.name.lower()} on "
            f"{b.resource_type.name.lower()} {b.name!r} ({b.pattern.name.lower()}) from {b.host}")

"""`semel group list|describe|reset-offsets|delete`: consumer and share groups over the wire.

Follows Kafka's kafka-consumer-groups.sh where it matters: offsets are reset
only for a group without live members (the broker refuses a commit outside
group management otherwise), a reset is a dry run unless --execute is given,
and a group with members cannot be deleted (NON_EMPTY_GROUP). A share group (KIP-932)
has no committed offsets: what it shows and resets is each share-partition's start
offset (DescribeShareGroupOffsets, AlterShareGroupOffsets), under the same rules.
"""
from __future__ import annotations

from ..client import admin, share_admin
from ..protocol.errors import KafkaError
from .main import CliError
from .route import Route
from .wire import add_bootstrap, run_action

# Kafka's group states in which nobody holds the group's partitions.
INACTIVE = ("Empty", "Dead")
# What an offset commit outside group management gets while the group has members.
LIVE_MEMBERS = (KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS)


def add_parser(sub) -> None:
    p = sub.add_parser("group", help="inspect, reset and delete consumer and share groups")
    gsub = p.add_subparsers(dest="action", metavar="ACTION")
    gsub.required = True
    ls = gsub.add_parser("list", help="groups and their states")
    ls.add_argument("--state", action="append", default=[], help="only these states (repeatable)")
    d = gsub.add_parser("describe", help="a group's members and committed offsets with lag")
    d.add_argument("group")
    r = gsub.add_parser("reset-offsets", help="move a group's committed offsets, or a share group's start offsets "
                                                "(group must have no members)")
    r.add_argument("group")
    scope = r.add_mutually_exclusive_group(required=True)
    scope.add_argument("--topic", action="append", metavar="TOPIC[:P,P...]",
                       help="a topic, or some of its partitions (repeatable)")
    scope.add_argument("--all-topics", action="store_true", help="every topic the group has offsets for")
    to = r.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true")
    to.add_argument("--to-latest", action="store_true")
    to.add_argument("--to-offset", type=int)
    to.add_argument("--shift-by", type=int)
    r.add_argument("--execute", action="store_true", help="apply the plan (default: show it only)")
    rm = gsub.add_parser("delete", help="delete groups without members, with their offsets")
    rm.add_argument("group", nargs="+")
    add_bootstrap((ls, d, r, rm), run)


def run(args) -> int:
    return run_action(args, _ACTIONS)


def _list(route: Route, args) -> int:
    """Every broker lists the groups it coordinates (ListGroups), as Kafka's do."""
    groups = {g[0]: g for c in route.every_broker() for g in admin.list_groups(c, args.state)}
    print("group\tstate\tprotocol-type\tgroup-type")
    for gid, ptype, state, kind in (groups[g] for g in sorted(groups)):
        print(f"{gid}\t{state}\t{ptype or '-'}\t{kind}")
    return 0


def _describe_one(client, group: str) -> admin.GroupDescription:
    (d,) = admin.describe_groups(client, [group])
    if d.error:
        raise CliError(f"describe {group}: {d.error.name}")
    return d


def _describe(route: Route, args) -> int:
    client = route.coordinator(args.group)
    d = _describe_one(client, args.group)
    offsets = admin.fetch_offsets(client, args.group)
    if d.state == "Dead" and not offsets:
        raise CliError(f"group {args.group!r} does not exist")
    if d.group_type == "share":
        print(f"group {d.group_id}: {d.state}, {len(d.members)} member(s), share group (KIP-932), "
              f"assignor {d.protocol}, group epoch {d.group_epoch}")
    elif d.group_type == "consumer":
        print(f"group {d.group_id}: {d.state}, {len(d.members)} member(s), consumer protocol (KIP-848), "
              f"assignor {d.protocol}, group epoch {d.group_epoch}, assignment epoch {d.assignment_epoch}")
    else:
        print(f"group {d.group_id}: {d.state}, {len(d.members)} member(s), classic protocol"
              + (f", assignor {d.protocol}" if d.protocol else ""))
    for m in d.members:
        print(f"  member {m.member_id} client {m.client_id} host {m.client_host}"
              + (f" instance {m.group_instance_id}" if m.group_instance_id else "")
              + (" classic protocol" if m.classic else "")
              + (f" epoch {m.member_epoch} assigned {_tps(m.assigned)}" if m.member_epoch is not None else "")
              + (f" target {_tps(m.target)}" if m.member_epoch is not None and m.target != m.assigned else ""))
    if d.group_type == "share":   # no committed offsets: each record is acknowledged on its own
        _share_offsets(client, args.group)
        return 0
    print("topic\tpartition\tcommitted\tlog-end\tlag")
    for (topic, partition), committed in sorted(offsets.items()):
        end = route.leader(topic, partition).list_offset(topic, partition, -1)
        print(f"{topic}\t{partition}\t{committed}\t{end}\t{max(0, end - committed)}")
    return 0


def _share_offsets(client, group: str) -> None:
    print("topic\tpartition\tstart-offset\tlag\tin-flight\tacquired\tarchived")
    for (topic, partition), o in sorted(share_admin.share_start_offsets(client, group).items()):
        told = ("-" if n < 0 else str(n) for n in (o.lag, o.in_flight, o.acquired, o.archived))
        print(f"{topic}\t{partition}\t{o.start}\t" + "\t".join(told))


def _tps(parts) -> str:
    return ",".join(f"{t}-{p}" for t, p in parts) or "-"


def _reset(route: Route, args) -> int:
    client = route.coordinator(args.group)
    d = _describe_one(client, args.group)
    if d.state not in INACTIVE:
        raise CliError(f"group {args.group!r} is {d.state} with {len(d.members)} member(s): offsets can be "
                       f"reset only while it has none (stop its consumers first)")
    share = d.group_type == "share"
    current = ({tp: o.start for tp, o in share_admin.share_start_offsets(client, args.group).items()}
               if share else admin.fetch_offsets(client, args.group))
    partitions = _scope(route.boot, args, current)
    plan = {tp: _target(route, tp, current.get(tp), args) for tp in partitions}
    print("topic\tpartition\tcurrent\tnew")
    for (topic, partition), new in sorted(plan.items()):
        old = current.get((topic, partition))
        print(f"{topic}\t{partition}\t{'-' if old is None else old}\t{new}")
    if not args.execute:
        print("(dry run: add --execute to commit these offsets)")
        return 0
    if share:
        return _reset_share(client, args.group, plan)
    result = admin.commit_offsets(client, args.group, plan)
    _refused(f"reset {args.group}", result, LIVE_MEMBERS)
    print(f"reset {len(plan)} partition(s) of group {args.group}")
    return 0


def _refused(what: str, result: dict[tuple[str, int], KafkaError], live: tuple[KafkaError, ...] = ()) -> None:
    """One line for the partitions a reset was refused, if any; `live` are the errors
    that mean the group has members."""
    failed = {tp: e for tp, e in result.items() if e}
    if failed:
        (topic, partition), err = sorted(failed.items())[0]
        hint = " (the group has live members)" if err in live else ""
        raise CliError(f"{what} {topic}-{partition}: {err.name}{hint}; "
                       f"{len(failed)} of {len(result)} partition(s) refused")


def _reset_share(client, group: str, plan: dict[tuple[str, int], int]) -> int:
    err, result = share_admin.alter_share_start_offsets(client, group, plan)
    if err == KafkaError.NON_EMPTY_GROUP:
        raise CliError(f"share group {group!r} has members now: start offsets can be reset only while it has "
                       f"none (stop its consumers first)")
    if err:
        raise CliError(f"reset share group {group}: {err.name}; nothing reset")
    _refused(f"reset share group {group}", result)
    print(f"reset the start offset of {len(plan)} partition(s) of share group {group}")
    return 0


def _scope(client, args, current: dict) -> list[tuple[str, int]]:
    if args.all_topics:
        if not current:
            raise CliError(f"group {args.group!r} has no committed offsets; name the topics with --topic")
        return sorted(current)
    out = []
    for spec in args.topic:
        topic, sep, plist = spec.partition(":")
        n = client.partitions(topic)
        if not sep:
            out += [(topic, p) for p in range(n)]
            continue
        try:
            wanted = [int(x) for x in plist.split(",") if x]
        except ValueError:
            raise CliError(f"--topic wants TOPIC or TOPIC:P,P..., got {spec!r}") from None
        bad = [p for p in wanted if not 0 <= p < n]
        if bad or not wanted:
            raise CliError(f"{topic} has partitions 0..{n - 1}, not {plist!r}")
        out += [(topic, p) for p in wanted]
    return sorted(set(out))


def _target(route: Route, tp: tuple[str, int], old: int | None, args) -> int:
    leader = route.leader(*tp)
    start = leader.list_offset(*tp, -2)
    end = leader.list_offset(*tp, -1)
    if args.to_earliest:
        return start
    if args.to_latest:
        return end
    want = args.to_offset if args.to_offset is not None else (end if old is None else old) + args.shift_by
    return min(max(want, start), end)   # Kafka clamps to the partition's range


def _delete(route: Route, args) -> int:
    """Each group at its own coordinator; one line per group deleted, one for those not."""
    refused = []
    for gid in dict.fromkeys(args.group):
        try:
            err = admin.delete_groups(route.coordinator(gid), [gid]).get(gid, KafkaError.UNKNOWN_SERVER_ERROR)
        except CliError as exc:
            refused.append(str(exc))
            continue
        if err == KafkaError.NONE:
            print(f"deleted group {gid}")
        elif err == KafkaError.NON_EMPTY_GROUP:
            refused.append(f"{gid}: NON_EMPTY_GROUP (it has live members)")
        else:
            refused.append(f"{gid}: {err.name}")
    if refused:
        raise CliError("not deleted: " + "; ".join(refused))
    return 0


_ACTIONS = {"list": _list, "describe": _describe, "reset-offsets": _reset, "delete": _delete}

"""The share group's simple assignor (KIP-932): balance first, then stickiness.

Per topic, among the members subscribed to it:
  - no more members than partitions: every partition goes to exactly one member, and
    the members' counts differ by at most one;
  - more members than partitions: every member gets exactly one partition, and the
    partitions' member counts differ by at most one (a share group lets several
    members read one partition; which record goes to whom is decided per acquisition).
Within those quotas a member keeps what it had, so a join or a leave moves as few
partitions as balance needs. Plain functions: soft state, recomputed when the group's
members, their subscriptions or the partition counts change.
"""
from __future__ import annotations

from typing import Hashable, Mapping, Sequence, TypeVar

H = TypeVar("H", bound=Hashable)
I = TypeVar("I", bound=Hashable)  # noqa: E741
TP = tuple[str, int]


def spread(holders: Sequence[H], items: Sequence[I], current: Mapping[H, Sequence[I]]) -> dict[H, list[I]]:
    """Each item to exactly one holder, len(items) // len(holders) each and one more for
    some; holders keep their current items where their quota allows, and the ones that
    keep most get the larger quotas (fewer moves)."""
    if not holders:
        return {}
    wanted = set(items)
    kept = {h: [i for i in current.get(h, ()) if i in wanted] for h in holders}
    order = sorted(holders, key=lambda h: -len(kept[h]))   # stable: ties keep the given order
    base, extra = divmod(len(items), len(holders))
    quota = {h: base + (1 if n < extra else 0) for n, h in enumerate(order)}
    out: dict[H, list[I]] = {h: [] for h in holders}
    taken: set[I] = set()
    for h in order:
        for i in kept[h]:
            if i not in taken and len(out[h]) < quota[h]:
                out[h].append(i)
                taken.add(i)
    free = iter([i for i in items if i not in taken])
    for h in order:
        while len(out[h]) < quota[h]:
            out[h].append(next(free))
    return out


def assign_topic(members: Sequence[str], partitions: int, current: Mapping[str, Sequence[int]]
                 ) -> dict[str, list[int]]:
    """member -> partitions of one topic (see the module's rules)."""
    if len(members) <= partitions:
        return spread(members, range(partitions), current)
    holders = spread(range(partitions), members,
                     {p: [m for m in members if p in current.get(m, ())] for p in range(partitions)})
    out: dict[str, list[int]] = {m: [] for m in members}
    for p, ms in holders.items():
        for m in ms:
            out[m].append(p)
    return out


def assign(subscriptions: Mapping[str, Sequence[str]], partition_counts: Mapping[str, int],
           current: Mapping[str, Sequence[TP]]) -> dict[str, list[TP]]:
    """member -> sorted (topic, partition) list, for every member of `subscriptions`
    (member -> topics); `current` is what each holds now."""
    out: dict[str, list[TP]] = {m: [] for m in subscriptions}
    topics = sorted({t for ts in subscriptions.values() for t in ts})
    for topic in topics:
        members = sorted(m for m, ts in subscriptions.items() if topic in ts)
        held = {m: [p for t, p in current.get(m, ()) if t == topic] for m in members}
        for m, ps in assign_topic(members, partition_counts.get(topic, 0), held).items():
            out[m].extend((topic, p) for p in ps)
    return {m: sorted(tps) for m, tps in out.items()}

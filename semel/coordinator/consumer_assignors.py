"""Server-side assignors of the consumer group protocol (KIP-848): `uniform` (the
default) and `range`. Pure functions: who subscribes to what and how many
partitions each topic has in, a target assignment out. No I/O, no clock.

An assignment is `{member_id: frozenset((topic, partition))}`; every member
named in `subscriptions` gets an entry (possibly empty), and no partition is
given to two members or to a member not subscribed to its topic.
"""
from __future__ import annotations

from typing import Callable, Mapping

TopicPartition = tuple[str, int]
Assignment = dict[str, frozenset[TopicPartition]]
Assignor = Callable[[Mapping[str, frozenset[str]], Mapping[str, int], Mapping[str, frozenset[TopicPartition]]],
                    Assignment]


def _eligible(subscriptions: Mapping[str, frozenset[str]], topics: Mapping[str, int]
              ) -> dict[TopicPartition, list[str]]:
    """Each existing partition of a subscribed topic -> the members subscribed to it, sorted."""
    out: dict[TopicPartition, list[str]] = {}
    for topic in sorted({t for subs in subscriptions.values() for t in subs}):
        count = topics.get(topic, 0)
        if count <= 0:
            continue
        members = sorted(m for m, subs in subscriptions.items() if topic in subs)
        for p in range(count):
            out[(topic, p)] = members
    return out


def uniform(subscriptions: Mapping[str, frozenset[str]], topics: Mapping[str, int],
            previous: Mapping[str, frozenset[TopicPartition]]) -> Assignment:
    """Spread partitions evenly over the members that may take them, keeping each
    partition where it was when that keeps the spread within one partition (sticky:
    fewer partitions move, so fewer revocations)."""
    eligible = _eligible(subscriptions, topics)
    members = sorted(subscriptions)
    owned: dict[str, set[TopicPartition]] = {m: set() for m in members}
    if not members or not eligible:
        return {m: frozenset() for m in members}
    takers = {m for ms in eligible.values() for m in ms}
    cap = -(-len(eligible) // max(1, len(takers)))   # ceil: nobody keeps more than an even share
    for m in members:
        keep = sorted(tp for tp in previous.get(m, ()) if m in eligible.get(tp, ()))
        owned[m].update(keep[:cap])
    placed = {tp for ps in owned.values() for tp in ps}
    for tp in sorted(eligible):
        if tp not in placed:
            target = min(eligible[tp], key=lambda m: (len(owned[m]), m))
            owned[target].add(tp)
    # Even out what stickiness and uneven subscriptions left: move a partition from a
    # member holding two or more than another member that may take it. Each move
    # narrows the spread, so this ends.
    for _ in range(len(eligible) * len(members)):
        moved = False
        for donor in sorted(members, key=lambda m: (-len(owned[m]), m)):
            for tp in sorted(owned[donor]):
                cands = [m for m in eligible[tp] if len(owned[m]) + 1 < len(owned[donor])]
                if cands:
                    taker = min(cands, key=lambda m: (len(owned[m]), m))
                    owned[donor].discard(tp)
                    owned[taker].add(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            break
    return {m: frozenset(owned[m]) for m in members}


def range_(subscriptions: Mapping[str, frozenset[str]], topics: Mapping[str, int],
           previous: Mapping[str, frozenset[TopicPartition]]) -> Assignment:
    """Per topic, contiguous ranges of partitions to its subscribers in member id order;
    the first `count % subscribers` members get one more."""
    owned: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    for topic in sorted({t for subs in subscriptions.values() for t in subs}):
        count = topics.get(topic, 0)
        members = sorted(m for m, subs in subscriptions.items() if topic in subs)
        if count <= 0 or not members:
            continue
        each, extra = divmod(count, len(members))
        start = 0
        for i, m in enumerate(members):
            n = each + (1 if i < extra else 0)
            owned[m].update((topic, p) for p in range(start, start + n))
            start += n
    return {m: frozenset(ps) for m, ps in owned.items()}


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_}
DEFAULT_ASSIGNOR = "uniform"

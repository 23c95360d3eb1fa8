"""Branches of a transaction (semel extension for the Spark sink's atomic micro-batches).

A parent transaction may join another ongoing transaction, its branch, by adding the
pseudo-partition (`__semel_branch:<branch transactional id>`, 0) with a standard
AddPartitionsToTxn. The pseudo-partition is then one of the parent's partitions, so it
is in the parent's log records and its Prepare record decides the branch too;
completing the parent "writes the marker" of a branch by preparing and completing the
branch under the branch's own producer id/epoch. All branches of one decision are
prepared in one coordinator record batch, and each data partition gets the markers
of every branch in one append (semel.coordinator.txn_completion), so a
read_committed reader sees a decided batch in a partition whole or not at all. While joined, a branch is the
parent's: its own timeout, EndTxn and produce are refused, and an InitProducerId of
the branch (a restarted task) aborts the undecided parent first, taking every branch
with it. A Kafka broker refuses the pseudo-topic (invalid name), which is how the sink
detects the extension. In a cluster a branch must map to its parent's
__transaction_state partition (same coordinator); one that does not is refused the
same way.

The branch index (`joined`) and the decisions on joins are the transaction shard's
(semel.coordinator.txn_shard); carrying a decision to the branches is its completion's
(semel.coordinator.txn_completion). This module names the pseudo-partition.
"""
from __future__ import annotations

BRANCH_PREFIX = "__semel_branch:"


def branch_of(tp: tuple[str, int]) -> str | None:
    """The branch transactional id a pseudo-partition names, or None for a real partition."""
    topic, partition = tp
    if topic.startswith(BRANCH_PREFIX) and partition == 0 and len(topic) > len(BRANCH_PREFIX):
        return topic[len(BRANCH_PREFIX):]
    return None

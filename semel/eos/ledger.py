"""What the broker knows about our cycles: the ledger.

Inside every broker transaction the runtime commits the consumed offsets, and
with them a small ledger: the cycle number of that transaction and the hold
floor (see below). Because the offsets and the ledger become visible exactly
when the transaction commits, reading the group's committed offsets at start
tells the runtime the last cycle whose broker transaction committed.

Two carriers, written together in the same transaction:

* the offset metadata string of each committed input partition:
  ``semel-eos/1 t=<transactional id> c=<cycle> h=<hold>``;
* optionally a marker topic with two partitions whose committed *offsets* are
  the cycle (partition 0) and the hold floor (partition 1). Some
  Kafka-compatible brokers drop offset metadata (Tansu 0.6 does); offsets are
  always kept.

Hold floor: a stranded transaction that could not be decided at some start is
left alone. Later cycles commit and move `c` past it, which would make it look
like an ordinary aborted cycle. The hold floor (the lowest undecided cycle, 0
for none) is carried forward so it stays undecided until an operator resolves
it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

_TAG = re.compile(r"^semel-eos/1 t=(\S+) c=(\d+) h=(\d+)$")


@dataclass(frozen=True)
class Ledger:
    committed: int  # cycle of the last committed broker transaction (0: none ever)
    hold: int = 0   # lowest undecided cycle carried forward (0: none)

    def __post_init__(self) -> None:
        if self.committed < 0 or self.hold < 0:
            raise ValueError(f"ledger values must be >= 0: {self}")

    def encode(self, transactional_id: str) -> str:
        return f"semel-eos/1 t={transactional_id} c={self.committed} h={self.hold}"

    @staticmethod
    def decode(text: str | None, transactional_id: str) -> "Ledger | None":
        """The ledger in an offset metadata string, if it is ours; None otherwise."""
        if not text:
            return None
        m = _TAG.match(text)
        if not m or m.group(1) != transactional_id:
            return None
        return Ledger(int(m.group(2)), int(m.group(3)))


class Decision(str, Enum):
    COMMIT = "commit"        # its broker transaction committed: finish the sink side
    ABORT = "abort"          # its broker transaction did not commit: roll back
    UNDECIDED = "undecided"  # cannot tell: leave it, warn, count it

    def __str__(self) -> str:
        return self.value


def decide(cycle: int | None, ledger: Ledger | None) -> Decision:
    """Recovery decision for a stranded prepared transaction of `cycle`.

    Why `cycle < committed` means aborted: the runtime never begins a cycle
    while a committed cycle is not finished in every participant (commit2PC
    failure is fatal, and a failed recovery commit stops the start). So an
    older stranded cycle can only be one whose broker transaction aborted,
    unless it was held as undecided, which the hold floor records.
    """
    if cycle is None or ledger is None:
        return Decision.UNDECIDED
    if cycle == ledger.committed and cycle > 0:
        return Decision.COMMIT
    if ledger.hold and ledger.hold <= cycle < ledger.committed:
        return Decision.UNDECIDED
    return Decision.ABORT

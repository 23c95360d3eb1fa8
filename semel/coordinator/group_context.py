"""What every part of a group coordinator works with, handed to each in one value."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..protocol.errors import KafkaError
from .coordinator_log import CoordinatorLog
from .group_model import GroupConfig
from .group_replay import GroupStore
from .group_timers import Timers
from .group_waiters import Waiters
from .runtime import CoordinatorRuntime


@dataclass(frozen=True, slots=True)
class GroupContext:
    """The groups in memory (`store`), the write path (`log`: append -> commit point ->
    apply, in log order, batches stamped by the coordinator's clock; `runtime.write` the
    same for a batch built already), the coordinator's timers, settings and clock, and
    `ready`: NONE while the coordinator serves, why not otherwise, and `waiters`: the
    classic members' JoinGroup and SyncGroup answers still owed."""
    store: GroupStore
    log: CoordinatorLog
    timers: Timers
    config: GroupConfig
    clock: Callable[[], int]
    ready: Callable[[], KafkaError]
    runtime: CoordinatorRuntime
    waiters: Waiters

"""Where a group or transaction command's requests go: the id's coordinator
(FindCoordinator), a partition's leader (Metadata) and, for a listing, every broker. On
a cluster these are different brokers, found from the one --bootstrap names, as Kafka's
admin client finds them; on a single node each is that broker."""
from __future__ import annotations

import time
from typing import Callable, Iterable, TypeVar

from ..client import Client, ClientError
from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from .main import CliError

GROUP, TRANSACTION = 0, 1        # FindCoordinator's key types
COORDINATOR_WAIT_S = 15.0        # a coordinator being elected or loaded answers "not yet"
T = TypeVar("T")
NOT_YET = (KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
           KafkaError.NOT_COORDINATOR)


class Route:
    """Connections to the brokers one command needs, opened once each."""

    def __init__(self, connect: Callable[[str], Client], boot: Client):
        self._connect = connect
        self.boot = boot
        self._conns: dict[str, Client] = {}

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    def at(self, address: str) -> Client:
        c = self._conns.get(address)
        if c is None:
            c = self._conns[address] = self._connect(address)
        return c

    def every_broker(self) -> list[Client]:
        """One connection per live broker (Metadata's list), for requests each broker
        answers for itself, such as ListGroups."""
        md = self.boot.metadata([])
        return [self.at(f"{b.host}:{b.port}") for b in sorted(md.brokers, key=lambda b: b.node_id)]

    def coordinator(self, key: str, key_type: int = GROUP) -> Client:
        """The coordinator of a group or transactional id; asked again while it is being
        elected or loaded."""
        deadline = time.monotonic() + COORDINATOR_WAIT_S
        while True:
            fc = self.boot.request(ApiKey.FIND_COORDINATOR, key=key, key_type=key_type)
            err = KafkaError(fc.error_code)
            if err == KafkaError.NONE:
                return self.at(f"{fc.host}:{fc.port}")
            if err not in NOT_YET or time.monotonic() > deadline:
                what = "group" if key_type == GROUP else "transactional id"
                raise CliError(f"the coordinator of {what} {key!r}: {err.name}")
            time.sleep(0.2)

    def by_coordinator(self, keys: list[str], key_type: int) -> list[tuple[Client, list[str]]]:
        """`keys` grouped by their coordinators, for one request to each."""
        return _grouped((self.coordinator(k, key_type), k) for k in keys)

    def by_leader(self, tps: list[tuple[str, int]]) -> list[tuple[Client, list[tuple[str, int]]]]:
        """Partitions grouped by their leaders, for one request to each."""
        return _grouped((self.leader(*tp), tp) for tp in tps)

    def leader(self, topic: str, partition: int) -> Client:
        md = self.boot.metadata([topic])
        t = md.topics[0]
        if t.error_code:
            raise ClientError(f"topic {topic}: {KafkaError(t.error_code).name}", KafkaError(t.error_code))
        leader = next((p.leader_id for p in t.partitions if p.partition_index == partition), -1)
        address = next((f"{b.host}:{b.port}" for b in md.brokers if b.node_id == leader), None)
        if address is None:
            raise CliError(f"{topic}-{partition} has no leader now (its replicas are offline); try again")
        return self.at(address)


def _grouped(pairs: Iterable[tuple[Client, T]]) -> list[tuple[Client, list[T]]]:
    out: dict[int, tuple[Client, list[T]]] = {}
    for c, item in pairs:
        out.setdefault(id(c), (c, []))[1].append(item)
    return list(out.values())

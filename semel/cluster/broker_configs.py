"""Dynamic broker configs (Kafka's DynamicBrokerConfig): the settings an operator may
change at runtime with AlterConfigs / IncrementalAlterConfigs on a BROKER resource.

Two levels, as Kafka's: the cluster-wide default (resource name "", Kafka's
`--entity-default`) and one broker's override (resource name its node id). A broker's
effective value is its override, else the default, else its start flag. Where they are
kept is the only difference between the two kinds of broker:
  EtcdBrokerConfigs   a cluster: in etcd (`broker-configs/` keys); every broker follows
                      the view's watch, so a change reaches all of them without a
                      restart; a write is applied by the broker that made it before it
                      answers
  FileBrokerConfigs   a single node: one checked file in its data dir
                      (`dynamic-broker-configs`), read at start, replaced atomically on
                      every change, so a change holds across a restart

Only the settings in DYNAMIC can be changed; others answer INVALID_CONFIG, as Kafka
answers for a read-only broker config.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

from ..protocol.errors import KafkaError
from ..storage import checked_file
from ..storage.fs import FileSystem
from .etcd import Json, delete_op, mod_equals, put_op

if TYPE_CHECKING:
    from ..storage.manager import LogManager
    from .metadata import EtcdClusterView

log = logging.getLogger("semel.cluster.broker_configs")

SUBTREE = "broker-configs/"     # beside configs/ (the cluster-wide replication throttle)
DEFAULT_KEY = "<default>"            # Kafka's name for the cluster-wide default entity
# Kafka's ConfigSource values DescribeConfigs reports.
DYNAMIC_BROKER, DYNAMIC_DEFAULT_BROKER, STATIC_BROKER = 2, 3, 4


def _int_at_least(lo: int) -> Callable[[str], int]:
    def parse(v: str) -> int:
        n = int(v)
        if n < lo:
            raise ValueError(f"must be at least {lo}")
        return n
    return parse


def _bool(v: str) -> bool:
    if v.lower() not in ("true", "false"):
        raise ValueError("must be true or false")
    return v.lower() == "true"


# A dynamic setting's value (the integers and booleans of DYNAMIC).
Value = int | bool


class DynamicFlags(Protocol):
    """The start flags a dynamic setting changes in place (semel.broker.config.BrokerConfig)."""
    auto_create_topics: bool
    connections_max_idle_ms: int


class ConfigHost(Protocol):
    """What the settings read and change: the broker's flags and its logs (None until open)."""

    @property
    def config(self) -> DynamicFlags: ...

    @property
    def logs(self) -> LogManager | None: ...


@dataclass(frozen=True)
class Setting:
    parse: Callable[[str], Value]
    get: Callable[[ConfigHost], Value]            # broker -> the value in force
    set: Callable[[ConfigHost, Value], None]      # (broker, value)


def _logs(broker: ConfigHost) -> LogManager:
    if broker.logs is None:
        raise RuntimeError("the broker's logs are not open yet")
    return broker.logs


def _set_log_default(field: str) -> Callable[[ConfigHost, Value], None]:
    def apply(broker: ConfigHost, value: Value) -> None:
        _logs(broker).set_default(field, value)
    return apply


def _set_attr(field: str) -> Callable[[ConfigHost, Value], None]:
    return lambda broker, value: setattr(broker.config, field, value)


DYNAMIC: dict[str, Setting] = {
    "log.retention.ms": Setting(_int_at_least(-1), lambda b: _logs(b).default_config.retention_ms,
                                _set_log_default("retention_ms")),
    "log.retention.bytes": Setting(_int_at_least(-1), lambda b: _logs(b).default_config.retention_bytes,
                                   _set_log_default("retention_bytes")),
    "auto.create.topics.enable": Setting(_bool, lambda b: b.config.auto_create_topics,
                                         _set_attr("auto_create_topics")),
    "connections.max.idle.ms": Setting(_int_at_least(1), lambda b: b.config.connections_max_idle_ms,
                                       _set_attr("connections_max_idle_ms")),
}


def wire(value: Value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def entity(resource_name: str) -> str | KafkaError:
    """The etcd entity of a BROKER resource name: "" the cluster default, a node id a broker."""
    if resource_name == "":
        return DEFAULT_KEY
    if resource_name.isdigit():
        return str(int(resource_name))
    return KafkaError.INVALID_REQUEST


def validate(configs: Mapping[str, str | None]) -> tuple[KafkaError, str]:
    for name, value in configs.items():
        setting = DYNAMIC.get(name)
        if setting is None:
            return KafkaError.INVALID_CONFIG, (f"{name} cannot be changed at runtime here (dynamic broker "
                                               f"configs: {', '.join(sorted(DYNAMIC))})")
        try:
            setting.parse(value if value is not None else "")
        except ValueError as exc:
            return KafkaError.INVALID_CONFIG, f"{name}={value!r}: {exc}"
    return KafkaError.NONE, ""


# A change of one entity's overrides, decided from the current ones: (error, message,
# the new overrides).
Decide = Callable[[dict[str, str]], tuple[KafkaError, str, dict[str, str]]]


def _overrides(stored: object) -> dict[str, str]:
    """One entity's overrides as stored (a decoded JSON object, or nothing)."""
    return {str(k): str(v) for k, v in stored.items()} if isinstance(stored, dict) else {}


class BrokerConfigs:
    """One broker's dynamic configs: what is set (`overrides`), what is in force
    (`effective`, `apply`) and a change decided against the current overrides (`alter`).
    `broker`: anything with the broker's `config` (BrokerConfig, changed in place) and
    `logs` (LogManager). Subclasses say where the overrides are kept."""

    def __init__(self, broker: ConfigHost, node_id: int):
        self.broker = broker
        self.node_id = node_id
        self.static: dict[str, Value] | None = None   # start flags, read once the logs are open
        self._applied = -1

    # --- where the overrides are kept ----------------------------------------

    def _items(self) -> Mapping[str, object]:
        """entity key -> its overrides, as last read or written."""
        raise NotImplementedError

    def _version(self) -> int:
        """Grows with every change of _items()."""
        raise NotImplementedError

    async def _write_if(self, entity_key: str, compute: Decide) -> tuple[KafkaError, str] | None:
        """Read the entity's overrides, decide with compute(current) -> (error, message,
        new overrides), validate, and write them unless another write came first
        (then None: decide again)."""
        raise NotImplementedError

    # --- the mechanism --------------------------------------------------------

    def overrides(self, entity_key: str) -> dict[str, str]:
        return _overrides(self._items().get(entity_key))

    def effective(self) -> dict[str, tuple[str, int]]:
        """name -> (value, ConfigSource) of every dynamic setting on this broker."""
        mine = self.overrides(str(self.node_id))
        default = self.overrides(DEFAULT_KEY)
        out: dict[str, tuple[str, int]] = {}
        for name in DYNAMIC:
            if name in mine:
                out[name] = (mine[name], DYNAMIC_BROKER)
            elif name in default:
                out[name] = (default[name], DYNAMIC_DEFAULT_BROKER)
            else:
                out[name] = (wire(self._static()[name]), STATIC_BROKER)
        return out

    def _static(self) -> dict[str, Value]:
        if self.static is None:
            self.static = {name: s.get(self.broker) for name, s in DYNAMIC.items()}
        return self.static

    def apply(self) -> None:
        """Put the effective values in force (after every change)."""
        if self._version() == self._applied or self.broker.logs is None:
            return
        self._applied = self._version()
        static = self._static()
        for name, (value, source) in self.effective().items():
            setting = DYNAMIC[name]
            want = static[name] if source == STATIC_BROKER else setting.parse(value)
            if setting.get(self.broker) != want:
                setting.set(self.broker, want)
                log.info("broker config %s = %s (%s)", name, wire(want),
                         {DYNAMIC_BROKER: "this broker's dynamic config", DYNAMIC_DEFAULT_BROKER:
                          "cluster-wide dynamic default", STATIC_BROKER: "start flag"}[source])

    async def alter(self, entity_key: str, compute: Decide) -> tuple[KafkaError, str]:
        """compute(current overrides) -> (error, message, new overrides), written by
        compare-and-set and decided again if another write came first."""
        while True:
            done = await self._write_if(entity_key, compute)
            if done is not None:
                if not done[0]:
                    self.apply()
                return done


def _decide(compute: Decide, current: dict[str, str]) -> tuple[KafkaError, str, dict[str, str]]:
    err, msg, wanted = compute(current)
    if not err:
        err, msg = validate(wanted)
    return err, msg, wanted


class EtcdBrokerConfigs(BrokerConfigs):
    """A cluster member's dynamic configs, in etcd, followed through the view's watch
    (created before the view starts, so its first read fills the cache)."""

    def __init__(self, broker: ConfigHost, view: EtcdClusterView):
        super().__init__(broker, view.node_id)
        self.view = view
        self.cache = view.key_cache(SUBTREE)
        view.add_change_listener(self.apply)

    def _items(self) -> Mapping[str, object]:
        return self.cache.items

    def _version(self) -> int:
        return self.cache.version

    async def _write_if(self, entity_key: str, compute: Decide) -> tuple[KafkaError, str] | None:
        key = self.view.keys.root + SUBTREE + entity_key
        kv = await self.view.etcd.get(key)
        err, msg, wanted = _decide(compute, _overrides(json.loads(kv.value)) if kv is not None else {})
        if err:
            return err, msg
        version = kv.mod_revision if kv is not None else 0
        op: Json = put_op(key, json.dumps(wanted).encode()) if wanted else delete_op(key)
        ok, rev = await self.view.etcd.txn([mod_equals(key, version)], [op])
        if not ok:
            return None
        if wanted:
            self.cache.put(entity_key, wanted, rev)
        else:
            self.cache.drop(entity_key, rev)
        return KafkaError.NONE, ""


FILE_NAME = "dynamic-broker-configs"
FILE_HEADER = "semel-dynamic-configs 1 "


class FileBrokerConfigs(BrokerConfigs):
    """A single node's dynamic configs, in one checked file of its data dir. The broker
    is the only writer and decides and writes without awaiting, so no other change can
    come between reading the overrides and replacing the file. A damaged file stops the
    start with a DamagedFile naming it (the settings in it are not guessed)."""

    def __init__(self, broker: ConfigHost, node_id: int, fs: FileSystem, data_dir: Path):
        super().__init__(broker, node_id)
        self.fs = fs
        self.path = data_dir / FILE_NAME
        self.items: dict[str, dict[str, str]] = {}
        self.version = 0

    def load(self) -> None:
        body = checked_file.read(self.fs, self.path, lambda data: checked_file.decode(FILE_HEADER, data),
                                 "dynamic broker configs")
        stored = json.loads(bytes(body)) if body is not None else {}
        self.items = {str(k): _overrides(v) for k, v in stored.items()}
        self.version += 1

    def _items(self) -> Mapping[str, object]:
        return self.items

    def _version(self) -> int:
        return self.version

    async def _write_if(self, entity_key: str, compute: Decide) -> tuple[KafkaError, str] | None:
        err, msg, wanted = _decide(compute, self.overrides(entity_key))
        if err:
            return err, msg
        items = {k: v for k, v in self.items.items() if k != entity_key}
        if wanted:
            items[entity_key] = wanted
        try:
            checked_file.write(self.fs, self.path, checked_file.encode(
                FILE_HEADER, json.dumps(items, sort_keys=True).encode()))
        except OSError as exc:   # the old file is intact: nothing changed
            return KafkaError.KAFKA_STORAGE_ERROR, f"{self.path}: {exc.strerror or exc}"
        self.items = items
        self.version += 1
        return KafkaError.NONE, ""

"""Dynamic broker configs (Kafka's DynamicBrokerConfig) for a cluster: the settings an
operator may change at runtime with AlterConfigs / IncrementalAlterConfigs on a BROKER
resource, kept in etcd and applied by every broker as its watch delivers them.

Two levels, as Kafka's: the cluster-wide default (resource name "", Kafka's
`--entity-default`) and one broker's override (resource name its node id). A broker's
effective value is its override, else the cluster default, else its start flag. Every
broker follows both through the view's watch (`broker-configs/` keys), so a change
reaches all of them without a restart; a write is applied by the broker that made it
before it answers.

Only the settings in DYNAMIC can be changed; others answer INVALID_CONFIG, as Kafka
answers for a read-only broker config.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

from ..protocol.errors import KafkaError
from .etcd import mod_equals, put_op

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


@dataclass(frozen=True)
class Setting:
    parse: Callable[[str], Any]
    get: Callable[[Any], Any]            # broker -> the value in force
    set: Callable[[Any, Any], None]      # (broker, value)


def _set_log_default(field: str) -> Callable[[Any, Any], None]:
    def apply(broker, value) -> None:
        broker.logs.set_default(field, value)
    return apply


def _set_attr(field: str) -> Callable[[Any, Any], None]:
    return lambda broker, value: setattr(broker.config, field, value)


DYNAMIC: dict[str, Setting] = {
    "log.retention.ms": Setting(_int_at_least(-1), lambda b: b.logs.default_config.retention_ms,
                                _set_log_default("retention_ms")),
    "log.retention.bytes": Setting(_int_at_least(-1), lambda b: b.logs.default_config.retention_bytes,
                                   _set_log_default("retention_bytes")),
    "auto.create.topics.enable": Setting(_bool, lambda b: b.config.auto_create_topics,
                                         _set_attr("auto_create_topics")),
    "connections.max.idle.ms": Setting(_int_at_least(1), lambda b: b.config.connections_max_idle_ms,
                                       _set_attr("connections_max_idle_ms")),
}


def wire(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def entity(resource_name: str) -> str | KafkaError:
    """The etcd entity of a BROKER resource name: "" the cluster default, a node id a broker."""
    if resource_name == "":
        return DEFAULT_KEY
    if resource_name.isdigit():
        return str(int(resource_name))
    return KafkaError.INVALID_REQUEST


def validate(configs: dict[str, str | None]) -> tuple[KafkaError, str]:
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


class BrokerConfigs:
    """One broker's follower of the dynamic configs (created before the view starts,
    so its first read fills the cache). `broker`: anything with the broker's `config`
    (BrokerConfig, changed in place) and `logs` (LogManager), as ClusterMember has."""

    def __init__(self, broker, view):
        self.broker = broker
        self.view = view
        self.cache = view.key_cache(SUBTREE)
        self.static: dict[str, Any] | None = None   # start flags, read once the logs are open
        self._applied = -1
        view.add_change_listener(self.apply)

    def overrides(self, entity_key: str) -> dict[str, str]:
        return dict(self.cache.items.get(entity_key) or {})

    def effective(self) -> dict[str, tuple[str, int]]:
        """name -> (value, ConfigSource) of every dynamic setting on this broker."""
        mine = self.overrides(str(self.view.node_id))
        default = self.overrides(DEFAULT_KEY)
        out = {}
        for name in DYNAMIC:
            if name in mine:
                out[name] = (mine[name], DYNAMIC_BROKER)
            elif name in default:
                out[name] = (default[name], DYNAMIC_DEFAULT_BROKER)
            else:
                out[name] = (wire(self._static()[name]), STATIC_BROKER)
        return out

    def _static(self) -> dict[str, Any]:
        if self.static is None:
            self.static = {name: s.get(self.broker) for name, s in DYNAMIC.items()}
        return self.static

    def apply(self) -> None:
        """Put the effective values in force (on every change the watch brings)."""
        if self.cache.version == self._applied or self.broker.logs is None:
            return
        self._applied = self.cache.version
        static = self._static()
        for name, (value, source) in self.effective().items():
            setting = DYNAMIC[name]
            want = static[name] if source == STATIC_BROKER else setting.parse(value)
            if setting.get(self.broker) != want:
                setting.set(self.broker, want)
                log.info("broker config %s = %s (%s)", name, wire(want),
                         {DYNAMIC_BROKER: "this broker's dynamic config", DYNAMIC_DEFAULT_BROKER:
                          "cluster-wide dynamic default", STATIC_BROKER: "start flag"}[source])

    async def alter(self, entity_key: str, compute) -> tuple[KafkaError, str]:
        """compute(current overrides) -> (error, message, new overrides), written by
        compare-and-set on the entity's key and decided again if another write came first."""
        key = self.view.keys.root + SUBTREE + entity_key
        while True:
            kv = await self.view.etcd.get(key)
            current = json.loads(kv.value) if kv is not None else {}
            err, msg, wanted = compute(current)
            if err:
                return err, msg
            err, msg = validate(wanted)
            if err:
                return err, msg
            version = kv.mod_revision if kv is not None else 0
            op = put_op(key, json.dumps(wanted).encode()) if wanted else \
                {"request_delete_range": {"key": put_op(key, b"")["request_put"]["key"]}}
            ok, rev = await self.view.etcd.txn([mod_equals(key, version)], [op])
            if ok:
                if wanted:
                    self.cache.put(entity_key, wanted, rev)
                else:
                    self.cache.drop(entity_key, rev)
                self.apply()
                return KafkaError.NONE, ""

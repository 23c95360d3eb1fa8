"""Configs: DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44).

Topic overrides live in the topic catalogue (durable, applied to the open logs at
once). Broker configs: the dynamic ones (semel.cluster.broker_configs) are alterable
and applied without a restart, kept in etcd in a cluster (every broker follows them)
and in the data dir on a single node; the rest are read-only start flags."""
from __future__ import annotations

from typing import Any, Callable

from ...cluster.broker_configs import (DEFAULT_KEY, DYNAMIC, DYNAMIC_DEFAULT_BROKER, BrokerConfigs, entity,
                                       validate)
from ...cluster.reassignment import THROTTLE_RATE
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ...storage.manager import validate_topic_config
from ..router import RequestContext, handler
from .common import warn_below_min_isr

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_GROUP = 32
# Kafka's ConfigSource of a group's own config.
SOURCE_GROUP = 8

# IncrementalAlterConfigs operations (Kafka's AlterConfigOp.OpType)
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
# Configs whose value is a comma-separated list: the only ones APPEND/SUBTRACT apply to.
LIST_CONFIGS = {"cleanup.policy"}

# name -> (value, Kafka's ConfigSource)
Values = dict[str, tuple[str, int]]
# (current overrides, the request's resource) -> (error, message, overrides wanted)
Compute = Callable[[dict[str, str], Any], tuple[KafkaError, str, dict[str, str]]]


@handler(ApiKey.DESCRIBE_CONFIGS, 1, 4)
async def describe_configs(ctx: RequestContext, req: Any) -> Any:
    cls = ctx.cls()
    results = []
    for res in req.resources:
        values, err = _config_values(ctx, res.resource_type, res.resource_name)
        wanted = set(res.configuration_keys) if res.configuration_keys is not None else None
        dynamic = _dynamic_names(ctx) if res.resource_type == RESOURCE_BROKER else set()
        configs = [cls.DescribeConfigsResult.DescribeConfigsResourceResult(
            name=k, value=v, read_only=res.resource_type == RESOURCE_BROKER and k not in dynamic,
            config_source=src, is_sensitive=False, synonyms=[])
            for k, (v, src) in sorted(values.items()) if wanted is None or k in wanted]
        results.append(cls.DescribeConfigsResult(
            error_code=err, error_message=None if err == 0 else err.name,
            resource_type=res.resource_type, resource_name=res.resource_name, configs=configs))
    return ctx.response(throttle_time_ms=0, results=results)


def _dynamic_names(ctx: RequestContext) -> set[str]:
    """The broker settings alterable at runtime (the replication throttle only in a cluster)."""
    throttled = ctx.services.admin.refuse_cluster_setting(THROTTLE_RATE) is None
    return set(DYNAMIC) | ({THROTTLE_RATE} if throttled else set())


def _defaults(ctx: RequestContext) -> dict[str, str]:
    log_cfg = ctx.services.logs.default_config   # with the dynamic defaults in force
    return {
        "retention.ms": str(log_cfg.retention_ms),
        "retention.bytes": str(log_cfg.retention_bytes),
        "segment.bytes": str(log_cfg.segment_bytes),
        "cleanup.policy": "delete",
        "max.message.bytes": str(ctx.services.config.max_message_bytes),
        "min.insync.replicas": str(ctx.services.config.min_insync_replicas),
    }


def _config_values(ctx: RequestContext, rtype: int, name: str) -> tuple[Values, KafkaError]:
    """name -> (value, source): source 1 = topic override, 5 = default (Kafka's ConfigSource)."""
    defaults = _defaults(ctx)
    if rtype == RESOURCE_BROKER:
        out, err = _broker_values(ctx, ctx.services.broker_configs, name, defaults)
        throttle = ctx.services.admin.cluster_setting(THROTTLE_RATE)
        if throttle is not None and not err:
            out[THROTTLE_RATE] = (throttle, 4)     # DYNAMIC_DEFAULT_BROKER_CONFIG: the cluster-wide one
        return out, err
    share = ctx.services.share_coordinator
    if rtype == RESOURCE_GROUP and share is not None:
        return {k: (v, SOURCE_GROUP if own else 5) for k, (v, own) in share.group_config_values(name).items()}, \
            KafkaError.NONE
    if rtype != RESOURCE_TOPIC:
        return {}, KafkaError.INVALID_REQUEST
    info = ctx.services.logs.topics().get(name)
    if info is None:
        return {}, KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    out = {k: (v, 5) for k, v in defaults.items()}
    for k, v in info.config.items():
        out[k] = (str(v), 1)
    return out, KafkaError.NONE


def _broker_values(ctx: RequestContext, dyn: BrokerConfigs, name: str,
                   defaults: dict[str, str]) -> tuple[Values, KafkaError]:
    """The default entity ("") lists what is set there; a broker lists its read-only
    defaults and the dynamic settings in force, each with its source."""
    key = entity(name)
    if isinstance(key, KafkaError):
        return {}, key
    if key == DEFAULT_KEY:
        return {k: (v, DYNAMIC_DEFAULT_BROKER) for k, v in dyn.overrides(DEFAULT_KEY).items()}, KafkaError.NONE
    if int(key) != ctx.services.config.node_id:   # Kafka: describe a broker on that broker
        return {}, KafkaError.INVALID_REQUEST
    out: Values = {k: (v, 5) for k, v in defaults.items()}
    out.update(dyn.effective())
    return out, KafkaError.NONE


@handler(ApiKey.ALTER_CONFIGS, 0, 2)
async def alter_configs(ctx: RequestContext, req: Any) -> Any:
    """The resource's overrides become exactly the ones given (Kafka's replace semantics)."""
    def compute(current: dict[str, str], res: Any) -> tuple[KafkaError, str, dict[str, str]]:
        return _unique({c.name: c.value for c in res.configs}, res.configs)
    return await _alter(ctx, req, compute)


@handler(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1)
async def incremental_alter_configs(ctx: RequestContext, req: Any) -> Any:
    """SET/DELETE/APPEND/SUBTRACT applied to the current overrides."""
    def compute(current: dict[str, str], res: Any) -> tuple[KafkaError, str, dict[str, str]]:
        err, msg, _ = _unique({}, res.configs)
        if err:
            return err, msg, {}
        out = dict(current)
        for c in res.configs:
            err, msg = _apply_op(out, c)
            if err:
                return err, msg, {}
        return KafkaError.NONE, "", out
    return await _alter(ctx, req, compute)


async def _alter_cluster(ctx: RequestContext, res: Any, compute: Compute, validate_only: bool) -> tuple[KafkaError, str]:
    """The cluster-wide default of a broker config (resource name ""), kept in etcd:
    only the replication throttle. Anything else is set at start (semel broker flags)."""
    admin = ctx.services.admin
    refused = admin.refuse_cluster_setting(THROTTLE_RATE)
    if refused:
        return KafkaError.INVALID_CONFIG, refused
    if res.resource_name != "":
        return KafkaError.INVALID_CONFIG, f"{THROTTLE_RATE} is set cluster-wide (resource name \"\"), not per broker"
    rate = admin.cluster_setting(THROTTLE_RATE)
    current = {THROTTLE_RATE: rate} if rate is not None else {}
    err, msg, wanted = compute(current, res)
    if err:
        return err, msg
    if set(wanted) - {THROTTLE_RATE}:
        return KafkaError.INVALID_CONFIG, f"only {THROTTLE_RATE} is a cluster-wide dynamic broker config"
    value = wanted.get(THROTTLE_RATE)
    if value is not None and (not value.isdigit()):
        return KafkaError.INVALID_CONFIG, f"{THROTTLE_RATE} is bytes per second, a whole number"
    if not validate_only:
        await admin.set_cluster_setting(THROTTLE_RATE, value)
    return KafkaError.NONE, ""


def _unique(config: dict[str, str], entries: list[Any]) -> tuple[KafkaError, str, dict[str, str]]:
    if len({c.name for c in entries}) != len(entries):  # Kafka: duplicate keys are a bad request
        return KafkaError.INVALID_REQUEST, "a config is named more than once", {}
    return KafkaError.NONE, "", config


def _apply_op(out: dict[str, str], c: Any) -> tuple[KafkaError, str]:
    if c.config_operation == SET:
        out[c.name] = c.value
    elif c.config_operation == DELETE:
        out.pop(c.name, None)
    elif c.config_operation in (APPEND, SUBTRACT):
        if c.name not in LIST_CONFIGS:
            return KafkaError.INVALID_CONFIG, f"{c.name} is not a list config; APPEND/SUBTRACT need one"
        items = [v for v in out.get(c.name, "delete").split(",") if v]
        given = [v.strip() for v in (c.value or "").split(",") if v.strip()]
        if c.config_operation == APPEND:
            items += [v for v in given if v not in items]
        else:
            items = [v for v in items if v not in given]
        out[c.name] = ",".join(items)
    else:
        return KafkaError.INVALID_REQUEST, f"unknown config operation {c.config_operation}"
    return KafkaError.NONE, ""


async def _alter(ctx: RequestContext, req: Any, compute: Compute) -> Any:
    cls = ctx.cls()
    responses = []
    for res in req.resources:
        err, msg = await _alter_one(ctx, res, compute, req.validate_only)
        responses.append(cls.AlterConfigsResourceResponse(
            error_code=err, error_message=None if err == 0 else (msg or err.name),
            resource_type=res.resource_type, resource_name=res.resource_name))
    return ctx.response(throttle_time_ms=0, responses=responses)


async def _alter_one(ctx: RequestContext, res: Any, compute: Compute, validate_only: bool) -> tuple[KafkaError, str]:
    if res.resource_type == RESOURCE_BROKER:
        if any(c.name == THROTTLE_RATE for c in res.configs):   # the reassignment throttle's own key
            return await _alter_cluster(ctx, res, compute, validate_only)
        return await _alter_broker(ctx, res, compute, validate_only)
    if res.resource_type == RESOURCE_GROUP:
        return await _alter_group(ctx, res, compute, validate_only)
    if res.resource_type != RESOURCE_TOPIC:
        return KafkaError.INVALID_REQUEST, f"resource type {res.resource_type} has no configs here"
    logs = ctx.services.logs
    info = logs.topics().get(res.resource_name)
    if info is None:
        return KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"topic {res.resource_name!r} does not exist"
    err, msg, wanted = compute(info.config, res)
    if err:
        return err, msg
    if validate_only:
        err, msg, _ = validate_topic_config(wanted)
        return err, msg
    err = logs.set_topic_config(res.resource_name, wanted)
    known = ctx.services.admin.topics().get(res.resource_name)
    if err == KafkaError.NONE and known is not None:
        warn_below_min_isr(ctx.services.config, res.resource_name, known.replication_factor, wanted)
    return err, logs.last_error_message


async def _alter_group(ctx: RequestContext, res: Any, compute: Compute, validate_only: bool) -> tuple[KafkaError, str]:
    """A share group's configs (share.*), kept by the share coordinator."""
    share = ctx.services.share_coordinator
    if share is None:
        return KafkaError.INVALID_REQUEST, "group configs are not served here"
    await share.refresh_configs(res.resource_name)   # in a cluster, another broker may have set them
    current = {k: v for k, (v, own) in share.group_config_values(res.resource_name).items() if own}
    err, msg, wanted = compute(current, res)
    if err:
        return err, msg
    err, why = await share.alter_configs(res.resource_name, wanted, validate_only)
    return err, why or ""


async def _alter_broker(ctx: RequestContext, res: Any, compute: Compute, validate_only: bool) -> tuple[KafkaError, str]:
    """The dynamic settings of the default (resource name "") or of one broker (its node
    id): written to etcd in a cluster, to the data dir on a single node."""
    dyn = ctx.services.broker_configs
    key = entity(res.resource_name)
    if isinstance(key, KafkaError):
        return key, f"broker resource name {res.resource_name!r} is neither \"\" nor a node id"
    refused = ctx.services.admin.refuse_broker(key)
    if refused:
        return KafkaError.INVALID_REQUEST, refused

    def decide(current: dict[str, str]) -> tuple[KafkaError, str, dict[str, str]]:
        return compute(current, res)
    if validate_only:
        err, msg, wanted = decide(dyn.overrides(key))
        return (err, msg) if err else validate(wanted)
    return await dyn.alter(key, decide)

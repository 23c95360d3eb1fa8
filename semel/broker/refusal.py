"""The refusal of a request: its API's response carrying one error wherever that
response carries errors, echoing what the request named (its topics and partitions,
its member id), as Kafka's getErrorResponse builds them. The one builder of refusals:
the coordinator gate (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS), the authorization
gate (*_AUTHORIZATION_FAILED) and the handlers call `refuse`, or `topic_entry` for the
topics of a request they refuse one by one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from .responses import by_topic
from .router import RequestContext


# (ctx, request body, code) -> the API's response refusing the request
Refusal = Callable[[RequestContext, Any, KafkaError], Any]


@dataclass(frozen=True)
class TopicShape:
    """Where the topics sit in one API's request and response."""
    req_list: str
    req_name: str
    req_parts: str | None          # partitions list in the request topic (None: topic-level API)
    req_index: str | None
    resp_list: str
    resp_name: str
    resp_parts: str | None
    resp_index: str | None
    resp_error: str = "error_code"


PRODUCE = TopicShape("topic_data", "name", "partition_data", "index",
                     "responses", "name", "partition_responses", "index")
FETCH = TopicShape("topics", "topic", "partitions", "partition",
                   "responses", "topic", "partitions", "partition_index")
LIST_OFFSETS = TopicShape("topics", "name", "partitions", "partition_index",
                          "topics", "name", "partitions", "partition_index")
OFFSET_COMMIT = TopicShape("topics", "name", "partitions", "partition_index",
                           "topics", "name", "partitions", "partition_index")
LEADER_EPOCH = TopicShape("topics", "topic", "partitions", "partition",
                          "topics", "topic", "partitions", "partition")
CREATE_TOPICS = TopicShape("topics", "name", None, None, "topics", "name", None, None)
CREATE_PARTITIONS = TopicShape("topics", "name", None, None, "results", "name", None, None)


def entry_class(owner_cls: Any, field_name: str) -> Any:
    """The class of the entries of `owner_cls`'s list field `field_name`."""
    field = next(f for f in owner_cls._struct._fields if f.name == field_name)
    # The entry class is the owner's attribute named after the field's type ("[]AclDescription").
    return getattr(owner_cls, field.type_str.lstrip("[]"))


def topic_entry(ctx: RequestContext, shape: TopicShape, topic: Any, code: KafkaError) -> Any:
    """The response entry refusing one topic of the request (each partition it named)."""
    T = entry_class(ctx.cls(), shape.resp_list)
    name = getattr(topic, shape.req_name)
    resp_parts, req_parts = shape.resp_parts, shape.req_parts
    if resp_parts is None or req_parts is None:
        return T(**{shape.resp_name: name, shape.resp_error: code})
    P = entry_class(T, resp_parts)
    parts = [P(**{str(shape.resp_index): getattr(p, str(shape.req_index)), shape.resp_error: code})
             for p in getattr(topic, req_parts) or ()]
    return T(**{shape.resp_name: name, resp_parts: parts})


def _every_topic(shape: TopicShape) -> Refusal:
    def refuse_topics(ctx: RequestContext, body: Any, code: KafkaError) -> Any:
        return ctx.response(**{shape.resp_list: [topic_entry(ctx, shape, t, code)
                                                 for t in getattr(body, shape.req_list) or ()]})
    return refuse_topics


def _offset_fetch(ctx: RequestContext, body: Any, code: KafkaError) -> Any:
    if ctx.api_version >= 8:   # several groups: the error on each
        return offset_fetch_groups_answer(ctx, body, lambda group_id: code)
    if ctx.api_version >= 2:   # the error at the top, no partitions (Kafka's answer)
        return ctx.response(error_code=code, topics=[])
    T = ctx.cls().OffsetFetchResponseTopic
    wanted = (((t.name, p), code) for t in body.topics or () for p in t.partition_indexes or ())
    grouped = by_topic(wanted, lambda p, err: T.OffsetFetchResponsePartition(
        partition_index=p, committed_offset=-1, committed_leader_epoch=-1, metadata="", error_code=err))
    return ctx.response(topics=[T(name=n, partitions=ps) for n, ps in grouped.items()])


def offset_fetch_groups_answer(ctx: RequestContext, body: Any, code_of: Callable[[str], KafkaError]) -> Any:
    """OffsetFetch (v8+, several groups) answered without reading: each group with
    `code_of(group_id)` and no topics."""
    G = entry_class(ctx.cls(), "groups")
    return ctx.response(groups=[G(group_id=g.group_id, topics=[], error_code=code_of(g.group_id))
                                for g in body.groups or ()])


def _add_partitions(ctx: RequestContext, body: Any, code: KafkaError) -> Any:
    return add_partitions_answer(ctx, body, lambda topic: code)


def add_partitions_answer(ctx: RequestContext, body: Any, code_of: Callable[[Any], KafkaError]) -> Any:
    """AddPartitionsToTxn (v3 and below) answered without adding: each topic's
    partitions with `code_of(topic)`."""
    T = entry_class(ctx.cls(), "results_by_topic_v3_and_below")
    P = entry_class(T, "results_by_partition")
    return ctx.response(throttle_time_ms=0, results_by_topic_v3_and_below=[
        T(name=t.name, results_by_partition=[P(partition_index=p, partition_error_code=code_of(t))
                                             for p in t.partitions]) for t in body.v3_and_below_topics or ()])


def _consumer_group_heartbeat(ctx: RequestContext, body: Any, code: KafkaError) -> Any:
    return ctx.response(throttle_time_ms=0, error_code=code, member_id=body.member_id or None,
                        member_epoch=-1, heartbeat_interval_ms=0, assignment=None)


# api key -> the refusal of a request whose response carries its errors below the top
_BUILDERS: dict[int, Refusal] = {
    ApiKey.PRODUCE: _every_topic(PRODUCE),
    ApiKey.OFFSET_COMMIT: _every_topic(OFFSET_COMMIT),
    ApiKey.TXN_OFFSET_COMMIT: _every_topic(OFFSET_COMMIT),
    ApiKey.OFFSET_FETCH: _offset_fetch,
    ApiKey.ADD_PARTITIONS_TO_TXN: _add_partitions,
    ApiKey.CONSUMER_GROUP_HEARTBEAT: _consumer_group_heartbeat,
}

# api key -> the other fields of a refusal with one top-level error
_TOP_LEVEL: dict[int, dict[str, Any]] = {
    ApiKey.INIT_PRODUCER_ID: {"producer_id": -1, "producer_epoch": -1},
    ApiKey.FIND_COORDINATOR: {"node_id": -1, "host": "", "port": -1},
    ApiKey.OFFSET_DELETE: {"topics": []},
}


def refuse(ctx: RequestContext, body: Any, code: KafkaError, **fields: Any) -> Any:
    """The response of ctx's API refusing the whole request `body` with `code`; `fields`
    add to a top-level refusal (an error message)."""
    build = _BUILDERS.get(ctx.api_key)
    if build is not None:
        return build(ctx, body, code)
    return ctx.response(error_code=code, **{**_TOP_LEVEL.get(ctx.api_key, {}), **fields})

"""Messages kafka-python's codec lacks, defined from schemas in `specs/` and built by
the codec's own machinery (so decoding, encoding, flexible versions and tagged
fields behave as for every other API)."""
from __future__ import annotations

import types
from typing import Any

from kafka.protocol.api_message import ApiMessage

from . import specs


class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=specs):
    pass


class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=specs):
    pass


class ConsumerGroupDescribeRequest(ApiMessage, load_json=specs):
    pass


def _operations_as_bitfield(json: dict[str, Any]) -> dict[str, Any]:
    # The codec's own messages mark AuthorizedOperations this way: a set of operation
    # codes in, Kafka's 32-bit field (or -2^31 for None) on the wire.
    group = next(f for f in json['fields'] if f['name'] == 'Groups')
    next(f for f in group['fields'] if f['name'] == 'AuthorizedOperations')['type'] = 'bitfield'
    return json


class ConsumerGroupDescribeResponse(ApiMessage, load_json=specs):
    @classmethod
    def json_patch(cls, json: dict[str, Any]) -> dict[str, Any]:
        return _operations_as_bitfield(json)


class ShareGroupHeartbeatRequest(ApiMessage, load_json=specs):
    pass


class ShareGroupHeartbeatResponse(ApiMessage, load_json=specs):
    pass


class ShareGroupDescribeRequest(ApiMessage, load_json=specs):
    pass


class ShareGroupDescribeResponse(ApiMessage, load_json=specs):
    @classmethod
    def json_patch(cls, json: dict[str, Any]) -> dict[str, Any]:
        return _operations_as_bitfield(json)


class ShareFetchRequest(ApiMessage, load_json=specs):
    pass


class ShareFetchResponse(ApiMessage, load_json=specs):
    pass


class ShareAcknowledgeRequest(ApiMessage, load_json=specs):
    pass


class ShareAcknowledgeResponse(ApiMessage, load_json=specs):
    pass


def _plain(name: str) -> type[ApiMessage]:
    """A message class with nothing to patch: its schema is specs/<name>.json."""
    return types.new_class(name, (ApiMessage,), {"load_json": specs}, lambda ns: ns.update(__module__=__name__))


# The share-group offset APIs (90-92), requests and responses.
SHARE_OFFSET_MESSAGES = tuple(_plain(f"{api}{kind}") for api in ("DescribeShareGroupOffsets", "AlterShareGroupOffsets",
                                                                 "DeleteShareGroupOffsets")
                              for kind in ("Request", "Response"))

EXTRA_MESSAGES = (ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse,
                  ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse,
                  ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse,
                  ShareGroupDescribeRequest, ShareGroupDescribeResponse,
                  ShareFetchRequest, ShareFetchResponse,
                  ShareAcknowledgeRequest, ShareAcknowledgeResponse, *SHARE_OFFSET_MESSAGES)

"""Share-group requests spoken over a raw socket (tests/support/wire.py), for tests that
check bytes and errors a ShareConsumer would hide: a member's join, ShareFetch and
ShareAcknowledge of partition 0, its leave, and `holding`: a member that holds records."""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from semel.protocol.messages import request_class
from tests.support.share import fill, set_group_configs
from tests.support.wire import call, connect

HEARTBEAT, FETCH, ACK, API_VERSIONS, METADATA = 76, 78, 79, 18, 3


def topic_id(sock, topic):
    md = call(sock, METADATA, 12, topics=[request_class(METADATA).MetadataRequestTopic(name=topic, topic_id=None)],
              allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    return md.topics[0].topic_id


def join(sock, group, topic):
    """A new member subscribed to `topic`: (member id, the heartbeat's answer)."""
    member = uuid.uuid4().hex[:22]
    r = call(sock, HEARTBEAT, 1, group_id=group, member_id=member, member_epoch=0, rack_id=None,
             subscribed_topic_names=[topic])
    assert r.error_code == 0, r
    return member, r


def leave(sock, group, member):
    left = call(sock, HEARTBEAT, 1, group_id=group, member_id=member, member_epoch=-1, rack_id=None,
                subscribed_topic_names=None)
    assert left.error_code == 0, left


def fetch(sock, group, member, epoch, tid, acks=(), max_records=5, corr=2, version=1, **fields):
    """ShareFetch of partition 0, acknowledging (first, last, type) batches."""
    R = request_class(FETCH)
    P = R.FetchTopic.FetchPartition
    batches = [P.AcknowledgementBatch(first_offset=f, last_offset=last, acknowledge_types=[t])
               for f, last, t in acks]
    asks = dict(max_wait_ms=500, min_bytes=1, max_bytes=1 << 20, max_records=max_records, batch_size=max_records)
    return call(sock, FETCH, version, corr, group_id=group, member_id=member, share_session_epoch=epoch,
                topics=[R.FetchTopic(topic_id=tid, partitions=[P(partition_index=0,
                                                                 acknowledgement_batches=batches)])],
                forgotten_topics_data=[], **{**asks, **fields})


def ack(sock, group, member, epoch, tid, acks, version=2, renew=False):
    """ShareAcknowledge of partition 0: (first, last, type) batches."""
    T = request_class(ACK).AcknowledgeTopic
    P = T.AcknowledgePartition
    fields = {"is_renew_ack": renew} if version >= 2 else {}
    return call(sock, ACK, version, 3, group_id=group, member_id=member, share_session_epoch=epoch, topics=[
        T(topic_id=tid, partitions=[P(partition_index=0, acknowledgement_batches=[
            P.AcknowledgementBatch(first_offset=f, last_offset=last, acknowledge_types=[t])
            for f, last, t in acks])])], **fields)


@contextmanager
def holding(bootstrap: str, group: str, topic: str, records: int, holds: int, **configs: str) -> Iterator[tuple]:
    """`topic` filled with `records`, the group reading from the earliest offset (and
    `configs`), and one member that fetched and holds the first `holds`: yields
    (socket, member id, topic id); its next fetch is at session epoch 1."""
    fill(bootstrap, topic, records)
    set_group_configs(bootstrap, group, share_auto_offset_reset="earliest", **configs)
    with connect(bootstrap) as sock:
        tid = topic_id(sock, topic)
        member, _ = join(sock, group, topic)
        got = fetch(sock, group, member, 0, tid, max_records=holds)
        assert got.error_code == 0, got
        yield sock, member, tid

"""MarkerChannel (semel.cluster.txn_markers) without brokers: routing by the partition's
leader, one WriteTxnMarkers per broker for markers asked for together, errors as values."""
from __future__ import annotations

import asyncio

from semel.cluster.state import BrokerInfo, MemoryClusterView
from semel.cluster.txn_markers import MarkerChannel, _partition_errors, _request_markers
from semel.protocol.errors import KafkaError
from semel.protocol.messages import response_class

E = KafkaError


def channel():
    table = MemoryClusterView.table()
    view = MemoryClusterView(table, 0, BrokerInfo(0, "127.0.0.1", 1))
    table.brokers[1] = BrokerInfo(1, "127.0.0.1", 2)
    table.create_topic("t", [(1, 0), (1, 0), (0, 1)])
    return MarkerChannel(view, 0, 1.0), table


def test_markers_asked_for_together_go_in_one_request_to_their_leader():
    ch, _ = channel()
    sent = []

    async def fake_send(node, batch):
        sent.append((node, [tp for _, tp, _ in batch]))
        return {tp: E.NONE for _, tp, _ in batch}
    ch._send = fake_send

    async def go():
        return await asyncio.gather(ch.write(("t", 0), True, [(7, 1)], 0), ch.write(("t", 1), True, [(7, 1)], 0))
    assert asyncio.run(go()) == [E.NONE, E.NONE]
    assert sent == [(1, [("t", 0), ("t", 1)])]
    assert ch.leads_here(("t", 2)) and not ch.leads_here(("t", 0))


def test_the_markers_of_every_producer_on_a_partition_go_in_one_request():
    """A decision's parent and branches: one write per partition, every producer in the
    same WriteTxnMarkers, each as its own marker of that partition."""
    ch, _ = channel()
    sent = []

    async def fake_send(node, batch):
        sent.append(_request_markers(batch))
        return {tp: E.NONE for _, tp, _ in batch}
    ch._send = fake_send

    async def go():
        return await asyncio.gather(ch.write(("t", 0), True, [(7, 1), (8, 0), (9, 2)], 4),
                                    ch.write(("t", 1), True, [(8, 0)], 4))
    assert asyncio.run(go()) == [E.NONE, E.NONE]
    assert len(sent) == 1
    assert sorted((m.producer_id, m.producer_epoch, [(t.name, t.partition_indexes) for t in m.topics])
                  for m in sent[0]) == [(7, 1, [("t", [0])]), (8, 0, [("t", [0, 1])]), (9, 2, [("t", [0])])]


def test_a_failed_request_fails_each_of_its_markers_and_unknown_leaders_are_values():
    ch, table = channel()

    async def fake_send(node, batch):
        return {tp: E.NOT_LEADER_OR_FOLLOWER for _, tp, _ in batch}
    ch._send = fake_send
    assert asyncio.run(ch.write(("t", 0), False, [(7, 1)], 0)) == E.NOT_LEADER_OR_FOLLOWER
    assert asyncio.run(ch.write(("nope", 0), False, [(7, 1)], 0)) == E.UNKNOWN_TOPIC_OR_PARTITION
    table.brokers.pop(1)
    assert asyncio.run(ch.write(("t", 0), False, [(7, 1)], 0)) == E.LEADER_NOT_AVAILABLE


def test_markers_of_a_deleted_partition_are_dropped_not_retried_for_ever():
    from types import SimpleNamespace
    ch, table = channel()
    ch._send = None          # nothing may be sent
    live = {"t": SimpleNamespace(partitions=3), "again": SimpleNamespace(partitions=1)}
    ch.view.topics = lambda: live
    ch.view.deleted_topics = lambda: {"gone": SimpleNamespace(partitions=2)}
    assert asyncio.run(ch.write(("gone", 1), True, [(7, 1)], 0)) == E.NONE           # deleted
    assert asyncio.run(ch.write(("again", 2), True, [(7, 1)], 0)) == E.NONE          # created again, smaller
    assert asyncio.run(ch.write(("unseen", 0), True, [(7, 1)], 0)) == E.UNKNOWN_TOPIC_OR_PARTITION   # view lags


def test_request_groups_partitions_per_marker_and_answers_map_back():
    fut = None
    batch = [([(7, 1, True, 3)], ("a", 0), fut), ([(7, 1, True, 3)], ("a", 1), fut), ([(7, 1, True, 3)], ("b", 0), fut),
             ([(8, 0, False, 3)], ("a", 0), fut)]
    markers = _request_markers(batch)
    assert [(m.producer_id, m.transaction_result, [(t.name, t.partition_indexes) for t in m.topics])
            for m in markers] == [(7, True, [("a", [0, 1]), ("b", [0])]), (8, False, [("a", [0])])]
    R = response_class(27).WritableTxnMarkerResult
    T = R.WritableTxnMarkerTopicResult
    P = T.WritableTxnMarkerPartitionResult
    resp = response_class(27)(version=1, markers=[
        R(producer_id=7, topics=[T(name="a", partitions=[P(partition_index=0, error_code=0),
                                                         P(partition_index=1, error_code=6)])]),
        R(producer_id=8, topics=[T(name="a", partitions=[P(partition_index=0, error_code=6)])])])
    # ("a", 0) answered twice: any error wins, so a marker that may be missing is retried.
    assert _partition_errors(resp) == {("a", 0): E.NOT_LEADER_OR_FOLLOWER,
                                     ("a", 1): E.NOT_LEADER_OR_FOLLOWER}


def test_an_unexpected_failure_answers_its_markers_and_the_next_request_goes_out():
    """A send that raises what the channel does not expect (a bug, an unknown answer)
    still answers every marker it took off the queue, so the coordinator retries
    instead of waiting for ever; the markers queued behind it go out in the next request."""
    ch, _ = channel()
    sent = []

    async def fake_send(node, batch):
        sent.append([tp for _, tp, _ in batch])
        if len(sent) == 1:
            await asyncio.sleep(0)          # lets the second marker queue behind this request
            raise ValueError("unexpected")
        return {tp: E.NONE for _, tp, _ in batch}
    ch._send = fake_send

    async def go():
        first = asyncio.create_task(ch.write(("t", 0), True, [(7, 1)], 0))
        await asyncio.sleep(0)
        second = asyncio.create_task(ch.write(("t", 1), True, [(7, 1)], 0))
        answers = await asyncio.wait_for(asyncio.gather(first, second), 10)
        return answers, await asyncio.wait_for(ch.write(("t", 0), True, [(7, 1)], 0), 10)
    answers, retried = asyncio.run(go())
    assert answers == [E.UNKNOWN_SERVER_ERROR, E.NONE]
    assert retried == E.NONE
    assert sent == [[("t", 0)], [("t", 1)], [("t", 0)]]
    assert not ch._senders and not ch._queued


def test_a_cancelled_sender_answers_the_batch_in_flight():
    ch, _ = channel()

    async def fake_send(node, batch):
        await asyncio.Event().wait()        # never answers
    ch._send = fake_send

    async def go():
        write = asyncio.create_task(ch.write(("t", 0), True, [(7, 1)], 0))
        await asyncio.sleep(0.01)
        ch.close()
        return await asyncio.wait_for(write, 10)
    assert asyncio.run(go()) == E.NETWORK_EXCEPTION


def test_a_broker_unreachable_for_many_retries_is_logged_once_then_once_recovered(caplog):
    """Markers to a killed broker are retried every few hundred ms for as long as it is
    down: one WARNING at the first failure, an INFO with the count when it answers again."""
    ch, _ = channel()
    answers = iter([ConnectionRefusedError("refused")] * 5 + [None])

    async def fake_call(node, info, markers):
        exc = next(answers)
        if exc is not None:
            raise exc
        R = response_class(27).WritableTxnMarkerResult
        T = R.WritableTxnMarkerTopicResult
        P = T.WritableTxnMarkerPartitionResult
        return response_class(27)(version=1, markers=[
            R(producer_id=7, topics=[T(name="t", partitions=[P(partition_index=0, error_code=0)])])])
    ch._call = fake_call

    async def go():
        return [await ch.write(("t", 0), True, [(7, 1)], 0) for _ in range(6)]
    with caplog.at_level("INFO", logger="semel.cluster.txn_markers"):
        results = asyncio.run(go())
    assert results == [E.NETWORK_EXCEPTION] * 5 + [E.NONE]
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "markers to broker 1" in r.getMessage()]
    assert lines == [("WARNING", "markers to broker 1 failed (refused); will retry"),
                     ("INFO", lines[1][1])], lines
    assert "after 5 failure(s)" in lines[1][1]

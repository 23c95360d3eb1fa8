"""semel.spark.pool: the connections a Spark Python worker keeps between tasks, against a
real broker process (reuse, close after an error, a restarted broker's closed connection
replaced, a reader generator closed mid-range)."""
from __future__ import annotations

import pytest

from semel.client.client import Client, ClientError
from semel.client.cluster import ClusterRouter
from semel.spark import pool
from tests.support.brokers import module_broker


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with module_broker(tmp_path_factory, "pool-broker") as b:
        with Client(b.bootstrap) as c:
            c.create_topic("pool-t", 1)
        yield b


@pytest.fixture(autouse=True)
def empty_pool():
    pool.clear()
    yield
    pool.clear()


def borrow(bootstrap: str):
    return pool.borrow(("t", bootstrap), lambda: Client(bootstrap), Client.idle_open, Client.close)


def test_a_connection_is_reused_after_a_normal_block(broker):
    with borrow(broker.bootstrap) as c1:
        assert c1.partitions("pool-t") == 1
    with borrow(broker.bootstrap) as c2:
        assert c2 is c1
        assert c2.partitions("pool-t") == 1


def test_an_error_in_the_block_closes_the_connection(broker):
    with pytest.raises(RuntimeError):
        with borrow(broker.bootstrap) as c1:
            raise RuntimeError("half-answered request")
    assert c1.sock.fileno() == -1  # closed, not kept
    with borrow(broker.bootstrap) as c2:
        assert c2 is not c1
        assert c2.partitions("pool-t") == 1


def test_a_connection_the_restarted_broker_closed_is_replaced(broker):
    with borrow(broker.bootstrap) as c1:
        pass
    broker.restart()
    assert not c1.idle_open()
    with borrow(broker.bootstrap) as c2:
        assert c2 is not c1
        assert c2.partitions("pool-t") == 1
    with pytest.raises((ClientError, OSError)):
        c1.partitions("pool-t")  # what a task would have hit without the check


def test_a_generator_closed_between_records_gives_its_connection_back(broker):
    def reader():
        with borrow(broker.bootstrap) as c:
            for _ in range(3):
                yield c

    gen = reader()
    c1 = next(gen)
    gen.close()
    with borrow(broker.bootstrap) as c2:
        assert c2 is c1


def test_a_cluster_drops_connections_its_broker_closed(broker):
    cluster = ClusterRouter(broker.bootstrap, topics=["pool-t"])
    try:
        assert cluster._conns
        broker.restart()
        cluster.drop_closed()
        assert not cluster._conns
        assert cluster.list_offsets([("pool-t", 0)], -2, True) == {("pool-t", 0): 0}  # reopened
    finally:
        cluster.close()

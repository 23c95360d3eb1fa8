"""A topic whose replication factor is below its min.insync.replicas refuses every acks=all
write with NOT_ENOUGH_REPLICAS, as Kafka does; semel makes it impossible to miss: a WARN
line when the topic is created or its config altered, the refusal's error message
(Produce v8+, as kafka-python reports it) naming the topic's replication factor and min.insync.replicas, and the
refusals counted per topic in semel_not_enough_replicas_total. A real broker process
and unmodified confluent-kafka and kafka-python."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError as CKError, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from support import wait
from support.brokers import module_broker

from semel.launch.process import free_port
from tests.integration.test_ops_metrics import scrape


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    port = free_port()
    with module_broker(tmp_path_factory, "min-isr", "--metrics-port", str(port)) as b:
        b.metrics_port = port
        yield b


def broker_log(broker) -> str:
    return broker.log_path.read_text()


def test_acks_all_refusal_names_the_replication_factor_and_min_insync_replicas(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    name = f"isr2-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 1, 1, config={"min.insync.replicas": "2"})])[name].result(30)
    wait.until(lambda: f"topic {name} has replication factor 1, below its min.insync.replicas 2" in broker_log(broker),
               timeout_s=10, what="the WARN line of the new topic")
    line = next(ln for ln in broker_log(broker).splitlines() if f"topic {name} has" in ln)
    assert "WARNING" in line and "NOT_ENOUGH_REPLICAS" in line and "replication factor >= 2" in line, line

    errors = []
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "retries": 0, "message.timeout.ms": 5000})
    for _ in range(3):   # one batch each: the metric counts refused writes
        p.produce(name, b"v", on_delivery=lambda err, msg: errors.append(err))
        assert p.flush(30) == 0
    assert [e.code() for e in errors] == [CKError.NOT_ENOUGH_REPLICAS] * 3
    # librdkafka reports the code alone; kafka-python raises with the answer's error_message
    from kafka import KafkaProducer
    from kafka.errors import NotEnoughReplicasError
    kp = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", retries=0)
    with pytest.raises(NotEnoughReplicasError) as refusal:
        kp.send(name, b"v").get(timeout=30)
    kp.close()
    assert (f"topic {name} has replication factor 1 and min.insync.replicas 2; 1 replica(s) in sync: "
            f"acks=all can never succeed on it (recreate it with replication factor >= 2, set its "
            f"min.insync.replicas to 1 or less, or produce with acks=1)") in str(refusal.value), refusal.value
    refused = scrape(broker.metrics_port)[("semel_not_enough_replicas_total", (("topic", name),))]
    assert refused == 4

    ok = Producer({"bootstrap.servers": broker.bootstrap, "acks": "1"})   # acks=1 is taken, as by Kafka
    ok.produce(name, b"w")
    assert ok.flush(30) == 0


def test_raising_min_insync_replicas_above_the_replication_factor_warns(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    name = f"alter-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    assert f"topic {name} has" not in broker_log(broker)   # min.insync.replicas 1: nothing to say
    res = ConfigResource("topic", name, incremental_configs=[ConfigEntry(
        "min.insync.replicas", "3", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(30)
    wait.until(lambda: f"topic {name} has replication factor 1, below its min.insync.replicas 3" in broker_log(broker),
               timeout_s=10, what="the WARN line of the altered topic")


def test_console_marks_a_topic_with_fewer_replicas_than_min_insync_replicas(broker, tmp_path):
    from tests.support.console import console_process, get
    from tests.support.wait import until
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    starved, fine = f"starved-{uuid.uuid4().hex[:8]}", f"fine-{uuid.uuid4().hex[:8]}"
    for topic in admin.create_topics([NewTopic(starved, 1, 1, config={"min.insync.replicas": "2"}),
                                      NewTopic(fine, 1, 1)]).values():
        topic.result(30)
    with console_process(broker.bootstrap, tmp_path / "console.log") as url:
        until(lambda: f'id="tp-{fine}-0"' in get(url, "/topics"), "the console lists both topics", 30)
        page = get(url, "/topics")

    def row(topic: str) -> str:
        return page[page.index(f'id="tp-{topic}-0"'):].split("</tr>")[0]
    assert "replication factor 1 &lt; min.insync.replicas 2: acks=all refused" in row(starved)
    assert 'class="bad"' in row(starved)
    assert "min.insync.replicas" not in row(fine)
    assert "every acks=all write to" in page and starved in page[page.index('id="below-min-isr"'):]

"""An outside project's Quix Streams test (run in an environment of its own: Quix
Streams needs confluent-kafka<2.13): a stateful app with exactly-once processing
counts its input per key into another topic; the broker is SIGKILLed and restarted
in the middle of the first run. Whatever that does to the run, running the app again
until it is idle leaves every count in the output exactly once: 1..N, no gap, no
repeat."""
import json
import time
import uuid

from confluent_kafka import Consumer, Producer
from quixstreams import Application

N = 40
RESTART_SAFE = {"metadata.recovery.strategy": "none"}   # docs/librdkafka-restart-hang.md


def run_app(bootstrap, src, dst, state_dir, on_record=None):
    app = Application(broker_address=bootstrap, consumer_group="quix-counter", auto_offset_reset="earliest",
                      processing_guarantee="exactly-once", state_dir=str(state_dir),
                      consumer_extra_config=RESTART_SAFE, producer_extra_config=RESTART_SAFE)
    sdf = app.dataframe(app.topic(src, value_deserializer="json"))

    def count(value, state):
        n = state.get("n", 0) + 1
        state.set("n", n)
        if on_record:
            on_record(n)
        return {"n": n}
    sdf = sdf.apply(count, stateful=True)
    sdf.to_topic(app.topic(dst, value_serializer="json"))
    try:
        app.run(timeout=8)
    except Exception as exc:   # a run the fault ended: the next run takes over
        return exc
    return None


def read_committed(config, topic, timeout_s=20):
    c = Consumer({**config, "group.id": f"check-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed"})
    c.subscribe([topic])
    got, idle_since = [], time.monotonic()
    while time.monotonic() - idle_since < 3 and time.monotonic() - idle_since < timeout_s:
        m = c.poll(0.3)
        if m is not None and not m.error():
            got.append(json.loads(m.value())["n"])
            idle_since = time.monotonic()
    c.close()
    return got


def test_round_trip(semel_topic, semel_confluent_config, tmp_path):
    src, dst = semel_topic(), semel_topic()
    p = Producer(semel_confluent_config)
    for i in range(5):
        p.produce(src, json.dumps({"i": i}).encode(), key=b"k")
    assert p.flush(30) == 0
    assert run_app(semel_confluent_config["bootstrap.servers"], src, dst, tmp_path / "state") is None
    assert read_committed(semel_confluent_config, dst) == [1, 2, 3, 4, 5]


def test_exactly_once_through_a_broker_kill(semel_broker, semel_topic, semel_confluent_config, tmp_path):
    src, dst = semel_topic(), semel_topic()
    p = Producer(semel_confluent_config)
    for i in range(N):
        p.produce(src, json.dumps({"i": i}).encode(), key=b"k")
    assert p.flush(30) == 0
    killed = []

    def kill_once(n):
        if n == N // 2 and not killed:
            killed.append(n)
            semel_broker.kill()
            semel_broker.restart()
    bootstrap = semel_confluent_config["bootstrap.servers"]
    runs = [run_app(bootstrap, src, dst, tmp_path / "state", kill_once)]
    while len(read_committed(semel_confluent_config, dst, 5)) < N and len(runs) < 4:
        runs.append(run_app(bootstrap, src, dst, tmp_path / "state"))
    assert killed
    assert read_committed(semel_confluent_config, dst) == list(range(1, N + 1)), runs

"""A client process of the check workload: one Kafka client, driven over pipes.

The controller starts `python -m semel.check.worker '<json config>'`, writes
one command per line to our stdin and reads one reply per line from stdout.
Replies say what happened, as the history needs it: ok / fail / info with the
micro-operations' results. The controller may SIGKILL or SIGSTOP us at any
moment; that is the point. We exit when stdin closes or our time is up, so a
lost controller never leaves us behind.

Roles:
  producer  transactional producer (plus a read_committed consumer for the
            polls inside transactions, whose offsets go into the transaction)
  consumer  a consumer that polls by assignment or by group subscription, at
            read_committed or read_uncommitted
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

from confluent_kafka import OFFSET_BEGINNING, OFFSET_STORED, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from semel.eos.kafka import RESTART_SAFE_CONFIG

POLL_BATCH = 200
SLOW_MS = 2000


class StepClock:
    """Which client call a transaction spent its time in."""

    def __init__(self):
        self.steps: list = []
        self.name: str | None = None
        self.t = time.monotonic()

    def step(self, name: str | None) -> None:
        now = time.monotonic()
        if self.name is not None:
            self.steps.append([self.name, round((now - self.t) * 1000)])
        self.name, self.t = name, now

    def done(self) -> list:
        self.step(None)
        return self.steps


def reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def now_ns() -> int:
    # CLOCK_MONOTONIC is one clock for every process of the machine.
    return time.monotonic_ns()


def _client_tuning(cfg: dict) -> dict:
    """Quick reconnects: brokers are killed and restarted under us. No re-bootstrap:
    librdkafka's strands send_offsets_to_transaction after a restart
    (docs/librdkafka-restart-hang.md), a client stall the checker would report
    as the broker's."""
    return {
        **RESTART_SAFE_CONFIG,
        "bootstrap.servers": cfg["bootstrap"],
        "client.id": cfg.get("client_id", "semel-check"),
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        "retry.backoff.ms": 50,
        "socket.connection.setup.timeout.ms": 5000,
        "topic.metadata.refresh.interval.ms": 5000,
        "log_level": 4,
    }


class ConsumerSide:
    """Polls and turns records into {key: [[offset, value], ...]}."""

    def __init__(self, cfg: dict, isolation: str, group: str | None):
        conf = dict(_client_tuning(cfg), **{
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "group.id": group or f"{cfg['topic']}-unused",
        })
        self.topic = cfg["topic"]
        self.consumer = Consumer(conf)
        self.rebalance: list = []
        self.at_end: set = set()
        self.errors: list = []

    def assign(self, keys: list, from_beginning: bool = True) -> None:
        offset = OFFSET_BEGINNING if from_beginning else OFFSET_STORED  # stored: the committed offset
        self.consumer.assign([TopicPartition(self.topic, k, offset) for k in keys])
        self.at_end = set()

    def subscribe(self) -> None:
        def on_assign(consumer, parts):
            self.rebalance.append(sorted(p.partition for p in parts))

        def on_revoke(consumer, parts):
            self.rebalance.append(sorted(p.partition for p in parts))

        self.consumer.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)

    def poll(self, timeout_s: float, max_records: int = POLL_BATCH) -> dict:
        reads: dict = {}
        for msg in self.consumer.consume(max_records, timeout_s):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self.at_end.add(msg.partition())
                elif len(self.errors) < 5:
                    self.errors.append(str(err))
                continue
            self.at_end.discard(msg.partition())
            try:
                value = int(msg.value())
            except (TypeError, ValueError):
                value = -1  # not ours: reported as an unexpected value
            reads.setdefault(str(msg.partition()), []).append([msg.offset(), value])
        return reads

    def take_rebalance(self) -> list:
        out, self.rebalance = self.rebalance, []
        return out

    def take_errors(self) -> list:
        out, self.errors = self.errors, []
        return out


class ProducerWorker:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.topic = cfg["topic"]
        self.timeout = cfg.get("txn_timeout_s", 10.0)
        self.producer = Producer(dict(_client_tuning(cfg), **{
            "transactional.id": cfg["txn_id"],
            "acks": "all",
            "linger.ms": 2,
            "transaction.timeout.ms": cfg.get("transaction_timeout_ms", 20000),
            "message.timeout.ms": int(self.timeout * 1000),
        }))
        self.reader = ConsumerSide(cfg, "read_committed", f"{cfg['txn_id']}-offsets")
        # Resume from the offsets our previous incarnation committed in its transactions.
        self.reader.assign(list(range(cfg["keys"])), from_beginning=False)

    def start(self) -> None:
        # Instances of one transactional id started together (the zombie slots) all
        # initialise at this wall-clock moment, so their InitProducerIds coincide.
        wait = self.cfg.get("start_at", 0) - time.time()
        if wait > 0:
            time.sleep(min(wait, 10.0))
        self.producer.init_transactions(self.timeout)

    def run_txn(self, cmd: dict) -> dict:
        self.clock = StepClock()
        out = self._run_txn(cmd)
        steps = self.clock.done()
        if sum(ms for _, ms in steps) >= SLOW_MS:
            out["slow_steps"] = steps  # where a slow transaction spent its time: broker diagnosis
        return out

    def _run_txn(self, cmd: dict) -> dict:
        step = self.clock.step
        results: list = []
        offsets: dict = {}
        delivery_errors: list = []

        def delivered(err, msg, idx):
            if err is None:
                offsets[idx] = msg.offset()
            else:
                delivery_errors.append(str(err))

        polled = False
        commit_ns = None
        try:
            step("begin")
            self.producer.begin_transaction()
            step("ops")
            for i, mop in enumerate(cmd["mops"]):
                if i and cmd.get("gap_ms"):
                    time.sleep(cmd["gap_ms"] / 1000)
                if mop[0] == "send":
                    _, key, value = mop
                    self.producer.produce(self.topic, value=str(value).encode(), partition=key,
                                          on_delivery=lambda e, m, i=i: delivered(e, m, i))
                    self.producer.poll(0)
                    results.append(["send", key, [None, value]])
                else:
                    results.append(["poll", self.reader.poll(0.2)])
                    polled = True
            step("flush")
            self.producer.flush(self.timeout)
            for i, mop in enumerate(results):
                if mop[0] == "send":
                    mop[2][0] = offsets.get(i)
            if delivery_errors:
                raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, delivery_errors[0]))
            if polled:
                positions = [tp for tp in self.reader.consumer.position(self.reader.consumer.assignment())
                             if tp.offset >= 0]  # a partition not fetched yet has no position to commit
                if positions:
                    step("send_offsets")
                    self.producer.send_offsets_to_transaction(
                        positions, self.reader.consumer.consumer_group_metadata(), self.timeout)
            if cmd.get("decision") == "abort":
                step("abort")
                self.producer.abort_transaction(self.timeout)
                return {"type": "fail", "value": results, "decision": "abort"}
            step("commit")
            commit_ns = now_ns()
            self._commit()
            return {"type": "ok", "value": results, "commit_ns": commit_ns}
        except KafkaException as exc:
            if commit_ns is not None:
                # We asked to commit and got no clean answer. Even an "abortable"
                # error leaves room for doubt about a commit request the broker may
                # have logged, so the outcome is unknown; our replacement fences it.
                return {"type": "info", "value": results, "error": str(exc.args[0]), "exit": True,
                        "commit_ns": commit_ns}
            return self._recover(exc, results)
        except BufferError as exc:
            return self._abort(results, f"local queue full: {exc}")
        except SystemError as exc:
            # confluent-kafka's binding, once fenced (fatal), can raise this from flush
            # instead of a KafkaException; the outcome is as unknown as after a fatal error.
            return {"type": "info", "value": results, "error": f"client failed: {exc}", "exit": True}

    def _commit(self) -> None:
        # Bounded so that a reply always reaches the controller before it gives up on us.
        deadline = time.monotonic() + self.timeout * 1.5
        while True:
            try:
                self.producer.commit_transaction(max(1.0, deadline - time.monotonic()))
                return
            except KafkaException as exc:
                err = exc.args[0]
                # Retriable: the outcome is still open; asking again is the documented way.
                if err.retriable() and time.monotonic() < deadline:
                    continue
                raise

    def _recover(self, exc: KafkaException, results: list) -> dict:
        err = exc.args[0]
        if err.txn_requires_abort():
            return self._abort(results, str(err))
        # Fatal or still retriable after our patience ran out: we do not know
        # whether the transaction took effect. The controller replaces us.
        return {"type": "info", "value": results, "error": str(err), "exit": True}

    def _abort(self, results: list, why: str) -> dict:
        self.clock.step("abort after error")
        try:
            self.producer.abort_transaction(self.timeout)
        except KafkaException as exc:
            return {"type": "info", "value": results, "error": f"{why}; abort failed: {exc.args[0]}",
                    "exit": True}
        # The abort was acknowledged: none of these records may ever be visible.
        return {"type": "fail", "value": results, "error": why}

    def handle(self, cmd: dict) -> dict:
        if cmd["op"] == "txn":
            return self.run_txn(cmd)
        if cmd["op"] == "close":
            self.producer.flush(self.timeout)
            return {"type": "ok", "exit": True}
        raise ValueError(f"unknown producer command {cmd['op']!r}")


class ConsumerWorker:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.mode = cfg["mode"]
        self.side = ConsumerSide(cfg, cfg["isolation"], cfg.get("group"))
        self.commit = self.mode == "subscribe"

    def start(self) -> None:
        if self.mode == "subscribe":
            self.side.subscribe()
        else:
            self.side.assign(cfg_keys(self.cfg))

    def handle(self, cmd: dict) -> dict:
        op = cmd["op"]
        if op == "poll":
            reads = self.side.poll(cmd.get("timeout_s", 0.5))
            out = {"type": "ok", "value": [["poll", reads]], "at_end": sorted(self.side.at_end)}
            if self.commit and reads:
                try:
                    self.side.consumer.commit(asynchronous=False)
                except KafkaException as exc:
                    out["commit_error"] = str(exc.args[0])
            rebalance = self.side.take_rebalance()
            if rebalance:
                out["rebalance"] = rebalance
            errors = self.side.take_errors()
            if errors:
                out["errors"] = errors
            return out
        if op == "assign":
            self.side.assign(cmd["keys"])
            return {"type": "ok", "value": cmd["keys"]}
        if op == "close":
            self.side.consumer.close()
            return {"type": "ok", "exit": True}
        raise ValueError(f"unknown consumer command {op!r}")


def cfg_keys(cfg: dict) -> list:
    return cfg.get("assign") or list(range(cfg["keys"]))


def _watchdog(max_seconds: float) -> None:
    time.sleep(max_seconds)
    os._exit(3)


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    threading.Thread(target=_watchdog, args=(cfg.get("max_seconds", 3600),), daemon=True).start()
    try:
        worker = ProducerWorker(cfg) if cfg["role"] == "producer" else ConsumerWorker(cfg)
        worker.start()
    except KafkaException as exc:
        reply({"ready": False, "error": str(exc.args[0])})
        return 1
    reply({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        cmd = json.loads(line)
        out = worker.handle(cmd)
        reply(out)
        if out.get("exit"):
            break
    # Skip librdkafka's orderly shutdown: the controller only wants us gone.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

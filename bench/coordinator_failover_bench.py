"""Coordinator failover time: SIGKILL the broker that is a client's coordinator
and time until the client's work goes through again.

One local cluster per lease TTL (etcd + three broker processes, semel.launch.local_cluster,
--min-insync-replicas 2); the internal topics are replicated like any topic (RF3). Two
unmodified confluent-kafka clients run throughout, each in its own thread:

- a transactional producer committing in a loop (begin, one record, commit), written
  as an application is: abortable errors abort, fatal ones make a new producer with the
  same transactional id (init_transactions), retriable ones retry the commit;
- a consumer committing offsets synchronously in a loop (assign, no subscription).

A round finds the coordinator with FindCoordinator for the client's id (so it holds
whatever partition the id hashes to), SIGKILLs that broker, and measures from the kill
to the completion of the first transaction (resp. offset commit) begun after the kill;
the killed broker is restarted and every internal partition's ISR is full again before
the next round. Transaction and group rounds alternate. For transactions, the first
commit of any kind that returned after the kill (often the one in flight, finished by the
new coordinator) is recorded beside it.

    python -m bench.coordinator_failover_bench [--quick]
"""
from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.common import RESULTS, SHARED_BOX, load_fields, main, write_result
from bench.failover_bench import _percentile

TOPIC = "coord-fo"
TXN_ID = "bench-coordinator-failover"
GROUP = "bench-coordinator-failover"
TXN_KEY, GROUP_KEY = 1, 0           # FindCoordinator key types
INTERNAL = ("__transaction_state", "__consumer_offsets")


class _Loop:
    """A client thread doing one unit of work after another; (began, ended) of each success."""

    def __init__(self):
        self.done: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            if self.step():
                self.done.append((began, time.monotonic()))

    def step(self) -> bool:
        raise NotImplementedError

    def first_after(self, t: float, began_after: bool = True, timeout_s: float = 120) -> float:
        """When the first unit begun (began_after) or ended after t ended."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            later = [end for began, end in self.done[-200:] if (began if began_after else end) > t]
            if later:
                return min(later)
            time.sleep(0.005)
        raise TimeoutError(f"nothing went through after the kill; last errors {self.errors[-3:]}")

    def busy(self) -> bool:
        return bool(self.done) and self.done[-1][1] > time.monotonic() - 1.0

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(120)
        self.close()

    def close(self) -> None:
        pass


class _Transactions(_Loop):
    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        self.producer = self._new()
        self.n = 0
        super().__init__()

    def _new(self):
        from confluent_kafka import KafkaException, Producer
        from semel.eos.kafka import RESTART_SAFE_CONFIG
        while True:
            p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": TXN_ID,
                          "transaction.timeout.ms": 60000, "linger.ms": 0, **RESTART_SAFE_CONFIG})
            try:
                p.init_transactions(60)
                return p
            except KafkaException as exc:
                self.errors.append(f"init_transactions: {exc}")

    def step(self) -> bool:
        from confluent_kafka import KafkaException
        try:
            self.producer.begin_transaction()
            self.producer.produce(TOPIC, value=b"%d" % self.n, partition=self.n % 3)
            self.n += 1
            for _ in range(10):
                try:
                    self.producer.commit_transaction(60)
                    return True
                except KafkaException as exc:
                    if not exc.args[0].retriable() or exc.args[0].txn_requires_abort():
                        raise
                    self.errors.append(f"commit (retrying): {exc}")
            raise RuntimeError("commit never went through")
        except KafkaException as exc:
            err = exc.args[0]
            self.errors.append(str(exc))
            if err.txn_requires_abort():
                try:
                    self.producer.abort_transaction(60)
                    return False
                except KafkaException as again:
                    self.errors.append(f"abort: {again}")
            self.producer = self._new()
            return False

    def close(self) -> None:
        self.producer.flush(10)


class _OffsetCommits(_Loop):
    def __init__(self, bootstrap: str):
        from confluent_kafka import Consumer, TopicPartition
        from semel.eos.kafka import RESTART_SAFE_CONFIG
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False,
                                  **RESTART_SAFE_CONFIG})
        self.consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(3)])
        self.TopicPartition = TopicPartition
        self.n = 0
        super().__init__()

    def step(self) -> bool:
        from confluent_kafka import KafkaException
        self.n += 1
        try:
            self.consumer.commit(offsets=[self.TopicPartition(TOPIC, p, self.n) for p in range(3)],
                                 asynchronous=False)
            return True
        except KafkaException as exc:
            self.errors.append(str(exc))
            time.sleep(0.01)     # librdkafka looks the coordinator up again meanwhile
            return False

    def close(self) -> None:
        self.consumer.close()


def _coordinator(cluster, key: str, key_type: int) -> int:
    """The coordinator's node id as a live broker's FindCoordinator answers it."""
    from semel.client.client import Client, ClientError
    from tests.support.wait import until

    def ask():
        for b in cluster.brokers:
            if not b.alive():
                continue
            try:
                with Client(b.bootstrap, timeout_s=5) as c:
                    r = c.request(10, key=key, key_type=key_type)
            except (ClientError, OSError):
                continue
            if r.error_code == 0:
                return (r.node_id,)
        return None
    return until(ask, "a coordinator", 60)[0]


def _settle(cluster) -> None:
    """Every broker registered, every internal partition led with a full ISR."""
    from tests.support.cluster import partitions, wait_brokers
    from tests.support.wait import until
    wait_brokers(cluster, {0, 1, 2})
    for topic in INTERNAL:
        until(lambda t=topic: all(st[0] >= 0 and len(st[3]) == 3 for st in partitions(cluster, t).values()),
              f"{topic}: full ISRs", 120)


def _rounds(ttl_s: int, rounds: int) -> list[dict]:
    from confluent_kafka.admin import AdminClient, NewTopic
    from semel.launch.local_cluster import LocalCluster
    from tests.support.cluster import wait_brokers
    from tests.support.wait import until
    out = []
    with tempfile.TemporaryDirectory(prefix="semel-coord-failover-") as tmp:
        cluster = LocalCluster(Path(tmp), 3, lease_ttl_s=ttl_s,
                               broker_args=["--min-insync-replicas", "2", "--group-initial-rebalance-delay-ms", "0"])
        try:
            cluster.start()
            wait_brokers(cluster, {0, 1, 2})
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
            (fut,) = admin.create_topics([NewTopic(TOPIC, 3, 3, config={"min.insync.replicas": "2"})]).values()
            fut.result(30)
            with _Transactions(cluster.bootstrap) as txns, _OffsetCommits(cluster.bootstrap) as commits:
                loops = {"transaction": (txns, TXN_ID, TXN_KEY), "group": (commits, GROUP, GROUP_KEY)}
                for r in range(rounds):
                    for kind in (("transaction", "group") if r % 2 == 0 else ("group", "transaction")):
                        loop, key, key_type = loops[kind]
                        _settle(cluster)
                        until(lambda: txns.busy() and commits.busy(), "both clients going through", 120)
                        coord = _coordinator(cluster, key, key_type)
                        seen = len(loop.errors)
                        killed = time.monotonic()
                        cluster.brokers[coord].kill()
                        first = loop.first_after(killed)
                        row = {"lease_ttl_s": ttl_s, "round": r, "coordinator": kind, "killed": coord,
                               "failover_s": round(first - killed, 3),
                               "load_average_1m": round(os.getloadavg()[0], 2)}
                        if kind == "transaction":
                            row["first_commit_returned_s"] = round(loop.first_after(killed, False) - killed, 3)
                        row["new_coordinator"] = _coordinator(cluster, key, key_type)
                        # What the client went through meanwhile (distinct messages, in order).
                        row["client_errors"] = list(dict.fromkeys(e[:160] for e in loop.errors[seen:]))[:6]
                        out.append(row)
                        print(row, flush=True)
                        cluster.brokers[coord].start()
        finally:
            cluster.stop()
            cluster.close()
    return out


def _summary(times: list[float]) -> dict:
    return {"p50_s": round(statistics.median(times), 3), "p99_s": round(_percentile(times, 0.99), 3),
            "max_s": max(times), "rounds": len(times)}


def run(out_dir: Path = RESULTS, quick: bool = False) -> dict:
    ttls = [2] if quick else [2, 6]
    rounds = 2 if quick else 7
    load_start = os.getloadavg()
    rows = [row for ttl in ttls for row in _rounds(ttl, rounds)]
    summary = {f"{kind}_coordinator_lease_ttl_{ttl}s": _summary([x["failover_s"] for x in rows
                                                                 if x["lease_ttl_s"] == ttl and x["coordinator"] == kind])
               for ttl in ttls for kind in ("transaction", "group")}
    result = {
        "what": ("seconds from SIGKILL of a client's coordinator's broker to the completion of the first "
                 "transaction (transactional producer) or offset commit (consumer) begun after the kill"),
        "cluster": ("etcd + 3 semel broker processes on this machine (semel.launch.local_cluster); internal topics RF3, "
                    "min.insync.replicas 2"),
        "client": ("confluent-kafka: a transactional producer committing one record per transaction in a loop; "
                   "a consumer (assign, no subscription) committing offsets synchronously in a loop; "
                   "metadata.recovery.strategy none; both running throughout"),
        "settings": {"lease_ttls_s": ttls, "rounds_per_ttl_and_kind": rounds, "quick": quick},
        "summary": summary,
        "machine_name": SHARED_BOX,
        **load_fields(load_start),
        "note": ("The lease TTL dominates, as for partition leaders: the controller moves the internal "
                 "partition when the killed broker's lease expires; then the new leader loads the "
                 "coordinator's state from its replica (and rolls Prepare* forward), and the client finds "
                 "it with FindCoordinator. first_commit_returned_s: the first commit_transaction that "
                 "returned after the kill, usually the one in flight, finished by the new coordinator."),
        "rows": rows,
    }
    write_result(out_dir, "coordinator_failover", result)
    print(f"coordinator failover {summary}")
    return result


if __name__ == "__main__":
    main(run)

"""Produce throughput with security on vs off, one run (target: >= 0.9).

Two semel brokers side by side: one plain (PLAINTEXT, no ACLs) and one secured
(SASL_SSL listener, SCRAM-SHA-512 login, authorizer on with a few hundred ACLs, the
producer allowed by a prefixed ACL). Same confluent-kafka producer settings, acks=all,
rounds alternated between the two so machine noise hits both; the median round
counts. Besides wall time, each round records the CPU seconds the broker process
(utime+stime from /proc) and this client process (librdkafka's threads included)
spent: on the shared 2-core box both compete for the same two cores, so TLS on the
client side lowers the ratio as much as TLS on the broker. Writes
bench/results/security.json.

    python -m bench.security [--quick] [--before DIR]

`--before DIR` also runs a plain and a secured broker of the semel source tree at DIR
(e.g. `git archive` of an earlier commit) in the same alternating rounds.
"""
from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, produce_all, write_result
from bench.hotpath_bench import cpu_seconds, tree_env
from bench.throughput_bench import PRODUCER
from semel.launch.process import SemelBroker, free_port, wait_for_port

PASSWORD = "bench-secret"


def certs(d: Path) -> tuple[Path, Path, Path]:
    from semel.testing.certs import make_certs
    return make_certs(d)


def _semel(*args, data_dir: Path, env=None) -> None:
    subprocess.run([sys.executable, "-m", "semel", *args, "--data-dir", str(data_dir)], check=True,
                   capture_output=True, env=dict(os.environ, **(env or {})))


# The secured broker's ACL store: the bench users' grants plus this many unrelated
# bindings, so every check searches a store of realistic size.
OTHER_ACLS = 300


def secure_data(data_dir: Path) -> int:
    """A secured broker's data folder: users admin (a super-user by --super-user) and
    writer, writer allowed to write and read topics bench-*, read groups bench*, and
    write idempotently; OTHER_ACLS unrelated bindings besides. Returns the ACL count."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for user in ("admin", "writer"):
        _semel("user", "add", user, "--password-env", "PW", data_dir=data_dir, env={"PW": PASSWORD})
    grants = [("write", "--topic", "bench-"), ("read", "--topic", "bench-"), ("read", "--group", "bench")]
    for op, kind, name in grants:
        _semel("acl", "add", "--allow", "User:writer", "--operation", op, kind, name, "--prefixed",
               data_dir=data_dir)
    _semel("acl", "add", "--allow", "User:writer", "--operation", "idempotent-write", "--cluster",
           data_dir=data_dir)
    from semel.broker.auth.acl import AclBinding, AclStore, Operation, PatternType, Permission, ResourceType
    AclStore(data_dir).add([AclBinding(ResourceType.TOPIC, f"other-{i}", PatternType.LITERAL, f"User:u{i}", "*",
                                       Operation.READ, Permission.ALLOW) for i in range(OTHER_ACLS)])
    return len(grants) + 1 + OTHER_ACLS


def secure_args(tls_port: int, cert: Path, key: Path) -> list[str]:
    """`semel broker start` arguments of the secured broker: a SASL_SSL listener, admin a super-user."""
    return ["--listener", f"SASL_SSL://127.0.0.1:{tls_port}", "--ssl-certfile", str(cert),
            "--ssl-keyfile", str(key), "--super-user", "User:admin"]


def secure_conf(tls_port: int, ca: Path, user: str = "writer") -> dict:
    """confluent-kafka settings for the secured listener: TLS checked against ca, SCRAM-SHA-512."""
    return {"bootstrap.servers": f"127.0.0.1:{tls_port}", "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(ca), "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user, "sasl.password": PASSWORD}


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _produce(conf: dict, topic: str, size: int, count: int, broker_pid: int) -> tuple[float, float, float]:
    """(wall s, broker CPU s, client CPU s) of one round. The producer connects and
    logs in (TLS handshake, SCRAM exchange, on the bootstrap and the leader connection:
    50-130 ms on this box) before the clock starts: producers log in once and then
    stream, so the round measures the streaming."""
    from confluent_kafka import Producer
    p = Producer({**PRODUCER, **conf})
    errors = []
    cb = lambda err, msg: errors.append(err) if err else None  # noqa: E731
    p.produce(topic, value=b"warm-up", partition=0, on_delivery=cb)
    if p.flush(60):
        raise RuntimeError("the warm-up record was not delivered")
    value = b"x" * size
    b0, c0, t0 = cpu_seconds(broker_pid), own_cpu(), time.perf_counter()
    produce_all(p, topic, 1, value, count, cb)
    if p.flush(300):
        raise RuntimeError("produce did not finish")
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} delivery errors, first: {errors[0]}")
    return wall, cpu_seconds(broker_pid) - b0, own_cpu() - c0


def _scrape(metrics_port: int) -> dict[str, float]:
    """Sums and counts from the broker's Prometheus endpoint: semel_request_seconds of
    Produce runs from the decoded request to its response being ready (the acks=all
    fsync included), so it leaves out reading, decrypting and the response's write;
    semel_event_loop_lag_seconds is how late the loop woke its watchdog (every 50 ms):
    what a long decryption or handler held it for, and on a busy box the scheduler."""
    import re
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    wanted = {"produce_s": r'semel_request_seconds_sum\{api="produce"\}',
              "produce_n": r'semel_request_seconds_count\{api="produce"\}',
              "lag_s": r"semel_event_loop_lag_seconds_sum", "lag_n": r"semel_event_loop_lag_seconds_count"}
    found = {k: re.search(rf"^{pattern} (\S+)$", text, re.M) for k, pattern in wanted.items()}
    return {k: float(m.group(1)) if m else 0.0 for k, m in found.items()}


def _timeline(conf: dict, topic: str, size: int, count: int, metrics_port: int) -> dict:
    """One more round per listener, outside the timed ones, that says where a produce
    request's time goes: librdkafka's statistics every 100 ms (the leader connection's
    rtt: request sent to response read; int_latency: produce() to the record being in
    a request; outbuf_latency: request built to written to the socket; requests in
    flight) next to the broker's own time per Produce request and its loop lag (_scrape). The
    rtt the broker does not account for is the transport: reading (and decrypting) the
    request, queueing behind the requests before it, writing the response."""
    import json
    from confluent_kafka import Producer
    windows: list[dict] = []

    def stats(text: str) -> None:
        leader = max(json.loads(text)["brokers"].values(), key=lambda b: b["tx"])
        if leader["rtt"]["cnt"]:
            windows.append({k: leader[k]["p50"] / 1000 for k in ("rtt", "int_latency", "outbuf_latency")}
                           | {"in_flight": leader["waitresp_cnt"]})

    p = Producer({**PRODUCER, **conf, "statistics.interval.ms": 100, "stats_cb": stats})
    p.produce(topic, value=b"warm-up", partition=0)
    p.flush(60)
    before = _scrape(metrics_port)
    errors: list = []
    produce_all(p, topic, 1, b"x" * size, count, lambda err, msg: errors.append(err) if err else None)
    p.flush(300)
    got = {k: v - before[k] for k, v in _scrape(metrics_port).items()}
    windows = windows[1:] or windows   # the first window holds the warm-up's login
    # A run shorter than one statistics window (--quick) has none: its figures are None.
    out = {f"client_{k}_p50_ms_median": round(statistics.median(w[k] for w in windows), 3) if windows else None
           for k in ("rtt", "int_latency", "outbuf_latency")}
    out["client_requests_in_flight_median"] = statistics.median(w["in_flight"] for w in windows) if windows else None
    out["broker_produce_requests"] = int(got["produce_n"])
    out["broker_produce_ms_mean"] = round(got["produce_s"] * 1000 / max(1, got["produce_n"]), 3)
    out["broker_loop_lag_ms_mean"] = round(got["lag_s"] * 1000 / max(1, got["lag_n"]), 3)
    out["errors"] = len(errors)
    return out


def _create(conf: dict, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)


def _load() -> list[float]:
    """The 1/5/15-minute load averages: the box is shared, and a busy one lowers the ratio."""
    return [round(x, 2) for x in os.getloadavg()]


SECURE = "sasl_scram_tls_acls"


def _pair(tmp: Path, tree: Path | None, cert: Path, key: Path, started: list) -> tuple[dict, dict, int, int]:
    """A plain and a secured broker running the source tree `tree` (None: this one), started
    (each added to `started` as it starts, for the caller to close whatever happens next):
    ({listener: SemelBroker}, {listener: metrics port}, the secured one's TLS port, its ACL count)."""
    env = tree_env(tree)
    name = "before" if tree else "this"
    sdata = tmp / f"secure-{name}"
    acls = secure_data(sdata)
    tls_port = free_port()
    mports = {"plain": free_port(), SECURE: free_port()}
    brokers = {"plain": SemelBroker(tmp / f"plain-{name}", log_path=tmp / f"plain-{name}.log", env=env,
                                    extra_args=["--metrics-port", str(mports["plain"])])}
    brokers[SECURE] = SemelBroker(sdata, log_path=tmp / f"secure-{name}.log", env=env, extra_args=[
        "--metrics-port", str(mports[SECURE]), *secure_args(tls_port, cert, key)])
    for b in brokers.values():
        started.append(b.start())
    wait_for_port("127.0.0.1", tls_port, 60)
    return brokers, mports, tls_port, acls


def _medians(rows: dict, count: int) -> dict:
    """Throughput and CPU medians of one tree's rounds ({listener: [(wall, broker CPU, client CPU)]})."""
    times = {k: [row[0] for row in v] for k, v in rows.items()}
    rate = {k: count / statistics.median(v) for k, v in times.items()}
    pair_ratios = [round(p / s, 3) for p, s in zip(times["plain"], times[SECURE])]
    cpu = {k: {"broker": round(statistics.median(row[1] for row in v), 3),
               "client": round(statistics.median(row[2] for row in v), 3)} for k, v in rows.items()}
    # CPU per record, each side: what TLS + SCRAM + ACLs add to the broker's work, whatever the load.
    us_per_record = {k: {side: round(sec * 1e6 / count, 2) for side, sec in v.items()} for k, v in cpu.items()}
    return {
        "seconds_per_round": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "records_per_s_median": {k: round(v) for k, v in rate.items()},
        "cpu_seconds_per_round_median": cpu,
        "cpu_us_per_record_median": us_per_record,
        "broker_cpu_secure_to_plain": round(cpu[SECURE]["broker"] / cpu["plain"]["broker"], 3),
        "ratio_secure_to_plain": round(rate[SECURE] / rate["plain"], 3),
        # Each round's two runs are back to back, so their ratio sees about the same load.
        "ratio_per_round": pair_ratios,
        "ratio_per_round_median": round(statistics.median(pair_ratios), 3),
    }


def _before_fields(rows: dict, tree: Path, count: int, after: dict) -> dict:
    """The before tree's medians beside this tree's, and this tree's over them."""
    before = _medians(rows, count)
    rate, cpu = after["records_per_s_median"], after["cpu_us_per_record_median"]
    return {"before": {"tree": str(tree), **before},
            "after_over_before": {
                **{f"records_per_s_{k}": round(rate[k] / v, 3) for k, v in before["records_per_s_median"].items()},
                **{f"broker_cpu_per_record_{k}": round(cpu[k]["broker"] / v["broker"], 3)
                   for k, v in before["cpu_us_per_record_median"].items()}}}


def run(out_dir: Path = RESULTS, quick: bool = False, before: Path | None = None) -> dict:
    """`before`: a semel source tree whose plain and secured brokers run in the same
    alternating rounds (results under `before` and `after_over_before`)."""
    size, count, rounds = 1024, (20_000 if quick else 100_000), (3 if quick else 7)
    load_start = _load()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ca, cert, key = certs(tmp)
        trees = {"this": None, **({"before": before} if before else {})}
        pairs, started = {}, []
        try:
            for label, tree in trees.items():
                brokers, mports, tls_port, acls = _pair(tmp, tree, cert, key, started)
                confs = {"plain": {"bootstrap.servers": brokers["plain"].bootstrap},
                         SECURE: secure_conf(tls_port, ca)}
                _create(confs["plain"], "bench-t")
                _create({**confs[SECURE], "sasl.username": "admin"}, "bench-t")
                pairs[label] = (brokers, mports, confs)
            runs = [(label, name) for label in pairs for name in ("plain", SECURE)]
            rows = {label: {name: [] for name in ("plain", SECURE)} for label in pairs}
            for r in range(rounds):
                for label, name in (runs if r % 2 == 0 else list(reversed(runs))):
                    brokers, _, confs = pairs[label]
                    rows[label][name].append(_produce(confs[name], "bench-t", size, count, brokers[name].proc.pid))
            _, mports, confs = pairs["this"]
            timeline = {name: _timeline(conf, "bench-t", size, count, mports[name]) for name, conf in confs.items()}
        finally:
            for b in started:
                b.close()
    after = _medians(rows["this"], count)
    result = {
        "what": "confluent-kafka produce, acks=all, 1 KiB records, 1 partition, flush=always; rounds alternated; "
                "each round's producer is connected and logged in before its clock starts",
        "records_per_round": count, "record_bytes": size, "rounds": rounds,
        "load_average_1_5_15_min": {"start": load_start, "end": _load()},
        **after,
        "target_ratio": 0.9,
        "acls_in_store": acls,
        "request_timeline": timeline,
        "request_timeline_what": "one extra round per listener after the timed ones (not in the ratio): "
                                 "librdkafka statistics of the leader connection, p50 per 100 ms window, "
                                 "median over windows; the broker's mean time per Produce from decoded "
                                 "request to response ready (fsync included) and mean event-loop lag "
                                 "(its watchdog wakes every 50 ms)",
        **(_before_fields(rows["before"], before, count, after) if before else {}),
    }
    result["meets_target"] = result["ratio_secure_to_plain"] >= 0.9
    path = write_result(out_dir, "security", result)
    print(path.read_text())
    return result


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    ap.add_argument("--before", type=Path, default=None, metavar="DIR",
                    help="also a plain and a secured broker of the semel source tree at DIR, in the same rounds")
    a = ap.parse_args()
    run(a.out, a.quick, a.before)

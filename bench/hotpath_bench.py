"""Broker hot path: semel (fsync on) and Tansu (memory) side by side.

One run, brokers alternated per round, the same confluent-kafka client for both:
1 producer x 1 partition and 4 x 8 at 1 KiB, 4 x 8 at 100 B, idempotent, plus
4 x 8 at 1 KiB transactional; acks=all. Per case: produce MB/s, consume records/s
(one consumer over every partition, reading the topic CONSUME_PASSES times) and the broker's CPU seconds per GB produced
and consumed, from utime+stime in /proc/PID/stat (and the two apart: user is Python and
the libraries, system the kernel's copies, fsyncs and wake-ups). A py-spy --native profile
of the semel broker during a 1 x 1 produce and during reads of a 4 x 8 100 B topic gives the
top functions (self samples, idle waits left out).

`--before DIR` also runs a semel source tree at DIR (e.g. a `git worktree add` of the
commit before a change) as a third broker, so before/after come from the same run;
`--earliest DIR` likewise runs the first measured tree, for CPU per GB against it.
`--malloc-ab` also runs this tree with glibc's malloc defaults (SEMEL_MALLOC_TUNING=off,
semel/broker/allocator.py), so the allocator tuning is measured against none in one run;
`--variant 'LABEL:NAME=VALUE,...'` runs this tree with other environment settings, and
`--variant-args 'LABEL:FLAGS'` with other `semel broker start` flags (e.g. 'no fsync:--flush-mode
never', to set semel beside Tansu's memory storage on equal terms).
Each row records the load average when it was taken (the box is shared).

    python -m bench.hotpath_bench [--quick] [--before /tmp/semel-before] [--malloc-ab]
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.common import RESULTS, produce_all, write_result
from semel.launch.process import SemelBroker, TansuBroker

PRODUCER = {"acks": "all", "enable.idempotence": True, "linger.ms": 5, "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576,
            "compression.type": "none"}
TXN_EVERY = 5_000          # records per transaction in the transactional case
# The topic is read this many times per measurement: one pass of 60 MB takes ~0.1 s,
# a few clock ticks of broker CPU (/proc counts in 10 ms ticks) and a noisy rate.
CONSUME_PASSES = 3
TICKS = os.sysconf("SC_CLK_TCK")

# (name, record bytes, producers, partitions, records per producer, transactional)
CASES = [("1x1 1KiB idempotent", 1024, 1, 1, 60_000, False),
         ("4x8 1KiB idempotent", 1024, 4, 8, 15_000, False),
         ("4x8 100B idempotent", 100, 4, 8, 100_000, False),
         ("4x8 1KiB transactional", 1024, 4, 8, 15_000, True)]


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the process: utime and stime of /proc/PID/stat
    (fields 14, 15). System time is the kernel's work for it: socket copies, pwrite
    into the page cache, fsync, futex wake-ups of worker threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def cpu_seconds(pid: int) -> float:
    return sum(cpu_times(pid))


def warm_guest_memory(gib: float) -> dict:
    """Touch `gib` GiB once and free it, before any broker starts.

    On this virtual machine the first touch of a guest page costs about 4 s of system
    time per GiB (the hypervisor backs it then): a broker's pwrite into fresh page-cache
    pages showed 4-5 s/GB of system time, 55-60% of it in the kernel's copy into the
    page cache (perf), against 0.7-1.0 s/GB once the memory had been touched. Which
    broker happened to get fresh pages decided its CPU per GB more than its code did;
    touched pages stay backed after they are freed, so every broker measures warm."""
    if gib <= 0:
        return {"gib": 0}
    u0, s0 = cpu_times(os.getpid())
    t0 = time.perf_counter()
    block = bytearray(int(gib * (1 << 30)))     # zero-filled: every page is written once
    del block
    u1, s1 = cpu_times(os.getpid())
    return {"gib": gib, "seconds": round(time.perf_counter() - t0, 1),
            "system_s_per_gib": round((s1 - s0) / gib, 2), "user_s_per_gib": round((u1 - u0) / gib, 2)}


def _create(bootstrap, topic, partitions):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)


def _produce_worker(bootstrap, topic, partitions, size, count, txn_id, start_at, q):
    """One producer process: waits for start_at so all producers start together."""
    from confluent_kafka import Producer
    conf = dict(PRODUCER, **{"bootstrap.servers": bootstrap})
    if txn_id:
        conf["transactional.id"] = txn_id
    p = Producer(conf)
    if txn_id:
        p.init_transactions(60)
    value = b"x" * size
    errors = []
    cb = lambda err, msg: errors.append(err) if err else None  # noqa: E731
    time.sleep(max(0.0, start_at - time.time()))
    def commit_now_and_then(i):
        if (i + 1) % TXN_EVERY == 0:
            p.commit_transaction(120)
            if i + 1 < count:
                p.begin_transaction()

    if txn_id:
        p.begin_transaction()
    produce_all(p, topic, partitions, value, count, cb, commit_now_and_then if txn_id else None)
    if txn_id and count % TXN_EVERY:
        p.commit_transaction(120)
    left = p.flush(300)
    q.put((time.time(), len(errors) + left, repr(errors[:1])))


def produce(bootstrap, topic, partitions, size, producers, count, txn) -> float:
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    start_at = time.time() + 3.0     # spawning and InitProducerId happen before the clock starts
    procs = [ctx.Process(target=_produce_worker,
                         args=(bootstrap, topic, partitions, size, count,
                               f"{topic}-txn-{i}" if txn else None, start_at, q)) for i in range(producers)]
    for pr in procs:
        pr.start()
    done = [q.get(timeout=600) for _ in procs]
    for pr in procs:
        pr.join(60)
    failed = [d for d in done if d[1]]
    if failed:
        raise RuntimeError(f"delivery errors: {failed}")
    return max(d[0] for d in done) - start_at


def consume(bootstrap, topic, partitions, total, txn) -> float:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                  "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760,
                  "isolation.level": "read_committed" if txn else "read_uncommitted"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got, t0 = 0, None
    deadline = time.perf_counter() + 300
    while got < total and time.perf_counter() < deadline:
        # Ask for no more than what is left: consume() waits out its timeout until it has
        # num_messages, which added a second to every measurement.
        for m in c.consume(num_messages=min(10000, total - got), timeout=1.0):
            if not m.error():
                # The clock starts at the first record: connecting and the first
                # metadata round trip are client start-up, not broker throughput.
                t0 = t0 or time.perf_counter()
                got += 1
    elapsed = time.perf_counter() - (t0 or deadline)
    c.close()
    if got < total:
        raise RuntimeError(f"consumed {got}/{total}")
    return elapsed


def measure(broker, label, case, round_no) -> dict:
    name, size, producers, partitions, count, txn = case
    topic = f"hp-{round_no}-{size}-{producers}x{partitions}{'-txn' if txn else ''}"
    _create(broker.bootstrap, topic, partitions)
    total = producers * count
    gb = total * size / 1e9
    (u0, s0) = cpu_times(broker.pid)
    pt = produce(broker.bootstrap, topic, partitions, size, producers, count, txn)
    (u1, s1) = cpu_times(broker.pid)
    ct = sum(consume(broker.bootstrap, topic, partitions, total, txn) for _ in range(CONSUME_PASSES))
    (u2, s2) = cpu_times(broker.pid)
    c0, c1, c2 = u0 + s0, u1 + s1, u2 + s2
    read = total * CONSUME_PASSES
    row = {"broker": label, "case": name, "round": round_no, "records": total,
           "load_average_1m": round(os.getloadavg()[0], 2),
           "produce_mb_s": round(total * size / pt / 1e6, 2), "produce_rec_s": round(total / pt),
           "consume_rec_s": round(read / ct), "consume_mb_s": round(read * size / ct / 1e6, 2),
           "cpu_s_per_gb_produce": round((c1 - c0) / gb, 2),
           "cpu_s_per_gb_consume": round((c2 - c1) / (gb * CONSUME_PASSES), 2),
           "user_s_per_gb_produce": round((u1 - u0) / gb, 2), "system_s_per_gb_produce": round((s1 - s0) / gb, 2),
           "user_s_per_gb_consume": round((u2 - u1) / (gb * CONSUME_PASSES), 2),
           "system_s_per_gb_consume": round((s2 - s1) / (gb * CONSUME_PASSES), 2)}
    print(row, flush=True)
    return row


def profile(broker, seconds: float, quick: bool) -> dict:
    """py-spy --native over a 1 x 1 1 KiB produce and over reads of a 4 x 8 100 B topic:
    the top functions by self samples (innermost native frame) and by innermost Python
    frame (with the native work it called), idle waits left out. py-spy stops the process
    at each sample, so the run is slower than unprofiled; shares, not rates, are the result."""
    scale = 0.25 if quick else 1.0
    out = {}
    for phase, (topic, size, producers, partitions, count) in (
            # Enough records to keep the broker busy for most of the sampling window
            # (py-spy slows it down): 60,000 gave 30 busy samples.
            ("produce 1x1 1KiB", ("hp-profile", 1024, 1, 1, int(300_000 * scale))),
            ("consume 4x8 100B", ("hp-profile-100", 100, 4, 8, int(100_000 * scale)))):
        _create(broker.bootstrap, topic, partitions)
        consuming = phase.startswith("consume")
        if consuming:   # the topic is written before py-spy starts: only the reads are sampled
            produce(broker.bootstrap, topic, partitions, size, producers, count, False)

        def load(end: float) -> None:
            if not consuming:
                produce(broker.bootstrap, topic, partitions, size, producers, count, False)
            else:
                # Reading back until py-spy stops: one pass is over in a fraction of a second.
                while time.monotonic() < end:
                    consume(broker.bootstrap, topic, partitions, producers * count, False)
        out[phase] = record_profile(broker.pid, seconds, load)
    return out


def record_profile(pid: int, seconds: float, load) -> dict:
    """py-spy --native on process `pid` for `seconds` while load(end) runs (end: the
    time.monotonic() by which to stop starting new work); its top_frames."""
    raw = Path(tempfile.mkdtemp(prefix="semel-prof-")) / "stacks.txt"
    spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid),
                            "--duration", str(int(seconds)), "--rate", "250", "--format", "raw",
                            "--native", "-o", str(raw)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    try:
        load(time.monotonic() + seconds - 2)
    finally:
        spy.wait(seconds + 60)
    return top_frames(raw)


# What a thread runs while it waits rather than works: a lock or semaphore acquire (a
# thread-pool worker parked on its queue, Condition.wait, a wait for the GIL), the event
# loop's selector poll, a sleep. py-spy --native samples waiting threads too (the GIL is
# released in a C wait) but they burn no CPU, so they are left out. Only the innermost
# WAIT_DEPTH frames are looked at (a wait and what it calls down to the futex): a
# worker thread running a job (the group-commit flusher's fsync, an offloaded pwrite)
# is busy, though the pool's _worker is up its stack.
WAITS = frozenset({
    "wait", "Condition.wait", "sleep", "select", "poll", "__poll", "ppoll", "__select",
    "PyThread_acquire_lock_timed", "pthread_cond_timedwait", "pthread_cond_wait", "pthread_cond_clockwait",
    "sem_clockwait", "sem_timedwait", "sem_wait", "__futex_abstimed_wait_common", "futex_wait",
    "epoll_pwait", "epoll_wait", "clock_nanosleep", "__clock_nanosleep", "nanosleep"})
WAIT_DEPTH = 6


def waiting(frames: list[str]) -> bool:
    """Whether a sampled stack (outermost frame first) is a thread waiting, not working."""
    return any(f.partition(" (")[0] in WAITS for f in frames[-WAIT_DEPTH:])


def _label(frame: str) -> str:
    """'name (file.py)' from py-spy's 'name (path/file.py:line)'."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0].split('/')[-1].rstrip(')')})"


def top_frames(raw: Path, n: int = 15) -> dict:
    """From py-spy's collapsed native stacks: the innermost frames by self samples
    (native functions: kernel entry points such as write/fsync/read, memcpy, CRC,
    the interpreter) and the innermost Python function of each sample, which with
    its inclusive share says where the Python time goes."""
    leaf, python, incl, total, idle = Counter(), Counter(), Counter(), 0, 0
    if not raw.exists():
        return {}
    for line in raw.read_text().splitlines():
        stack, _, num = line.rpartition(" ")
        if not stack or not num.isdigit():
            continue
        k = int(num)
        frames = stack.split(";")
        if waiting(frames):
            idle += k
            continue
        total += k
        leaf[_label(frames[-1])] += k
        py = [_label(f) for f in frames if ".py" in f.rpartition(" (")[2]]
        if py:
            python[py[-1]] += k
        for f in set(py):
            incl[f] += k

    def pct(v):
        return round(100 * v / max(total, 1), 1)
    return {"busy_samples": total, "idle_samples_left_out": idle,
            "native_self": [{"function": f, "self_pct": pct(v)} for f, v in leaf.most_common(n)],
            "python_innermost": [{"function": f, "self_pct": pct(v), "inclusive_pct": pct(incl[f])}
                                 for f, v in python.most_common(n)]}


def summarise(rows, labels) -> list[dict]:
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        med = {}
        for label in labels:
            rs = [r for r in rows if r["case"] == case and r["broker"] == label]
            if rs:
                med[label] = {k: statistics.median(r[k] for r in rs)
                              for k in ("produce_mb_s", "produce_rec_s", "consume_rec_s",
                                        "cpu_s_per_gb_produce", "cpu_s_per_gb_consume",
                                        "user_s_per_gb_produce", "system_s_per_gb_produce",
                                        "user_s_per_gb_consume", "system_s_per_gb_consume")}
        entry = {"case": case, "median": med}
        s, t = med.get("semel (fsync)"), med.get("tansu (memory)")
        if s and t:
            entry["produce_semel_over_tansu"] = round(s["produce_mb_s"] / t["produce_mb_s"], 2)
            entry["consume_semel_over_tansu"] = round(s["consume_rec_s"] / t["consume_rec_s"], 2)
        for label in labels:
            m = med.get(label)
            if s and m and label.startswith("semel,"):     # this tree with other settings
                entry[f"semel_over_{label}"] = {
                    "produce": round(s["produce_mb_s"] / m["produce_mb_s"], 2),
                    "consume": round(s["consume_rec_s"] / m["consume_rec_s"], 2),
                    "cpu_per_gb_consume": round(s["cpu_s_per_gb_consume"] / max(m["cpu_s_per_gb_consume"], 1e-9), 2)}
        e = med.get(EARLIEST)
        if s and e:
            entry["cpu_per_gb_produce_over_earliest"] = round(
                s["cpu_s_per_gb_produce"] / max(e["cpu_s_per_gb_produce"], 1e-9), 2)
            entry["cpu_per_gb_consume_over_earliest"] = round(
                s["cpu_s_per_gb_consume"] / max(e["cpu_s_per_gb_consume"], 1e-9), 2)
        b = med.get("semel before (fsync)")
        if s and b:
            entry["produce_after_over_before"] = round(s["produce_mb_s"] / b["produce_mb_s"], 2)
            entry["consume_after_over_before"] = round(s["consume_rec_s"] / b["consume_rec_s"], 2)
            entry["cpu_per_gb_produce_after_over_before"] = round(
                s["cpu_s_per_gb_produce"] / max(b["cpu_s_per_gb_produce"], 1e-9), 2)
        out.append(entry)
    return out


MALLOC_DEFAULTS = "semel, glibc malloc defaults (fsync)"
EARLIEST = "semel earliest (fsync)"


def tree_env(tree: Path | None) -> dict:
    """Environment that makes `python -m semel` run the source tree at `tree` (None: this one)."""
    # `python -m` puts the working directory first on sys.path, ahead of
    # PYTHONPATH: without PYTHONSAFEPATH the broker ran this tree's code.
    return {} if tree is None else {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}


def _tree_broker(tmp: str, name: str, tree: Path) -> SemelBroker:
    """A semel broker running the source tree at `tree` (a `git worktree add` of a commit)."""
    return SemelBroker(Path(tmp) / name, log_path=Path(tmp) / f"{name}.log", env=tree_env(tree))


def run(out_dir: Path = RESULTS, quick: bool = False, before: Path | None = None, rounds: int | None = None,
        cases: list[str] | None = None, malloc_ab: bool = False, name: str = "hotpath",
        variants: list[str] = (), note: str | None = None, earliest: Path | None = None,
        warm_gib: float = 0.0, scale: float | None = None, variant_args: list[str] = ()) -> dict:
    rounds = rounds or (1 if quick else 5)
    scale = scale or (0.25 if quick else 1.0)
    chosen = [(n, s, p, k, int(c * scale), t) for n, s, p, k, c, t in CASES if not cases or n in cases]
    rows = []
    with tempfile.TemporaryDirectory(prefix="semel-hotpath-") as tmp:
        brokers = {"semel (fsync)": SemelBroker(Path(tmp) / "after", log_path=Path(tmp) / "after.log"),
                   "tansu (memory)": TansuBroker()}
        if before:
            brokers["semel before (fsync)"] = _tree_broker(tmp, "before", before)
        if earliest:
            brokers[EARLIEST] = _tree_broker(tmp, "earliest", earliest)
        if malloc_ab:
            variants = [f"{MALLOC_DEFAULTS}:SEMEL_MALLOC_TUNING=off", *variants]
        for k, spec in enumerate(variants):
            label, _, env = spec.partition(":")
            label = label if label.startswith("semel,") else f"semel, {label}"
            brokers[label] = SemelBroker(Path(tmp) / f"variant{k}", log_path=Path(tmp) / f"variant{k}.log",
                                         env=dict(kv.split("=", 1) for kv in env.split(",") if kv))
        for k, spec in enumerate(variant_args):
            label, _, args = spec.partition(":")
            brokers[f"semel, {label}"] = SemelBroker(Path(tmp) / f"args{k}", log_path=Path(tmp) / f"args{k}.log",
                                                     extra_args=args.split())
        warmup = warm_guest_memory(warm_gib)
        load_start = [round(x, 2) for x in os.getloadavg()]
        try:
            for b in brokers.values():
                b.start()
            for r in range(rounds):
                for case in chosen:
                    order = list(brokers.items())
                    if r % 2:
                        order.reverse()      # alternate who goes first: page cache, CPU boost, neighbours
                    for label, b in order:
                        rows.append(measure(b, label, case, r))
            prof = profile(brokers["semel (fsync)"], 8 if quick else 20, quick)
        finally:
            for b in brokers.values():
                b.close()
    result = {"client": "confluent-kafka (librdkafka), one process per producer", "settings": PRODUCER,
              "load_average_start": load_start, "load_average_end": [round(x, 2) for x in os.getloadavg()],
              "memory_warmup": warmup, "txn_records_per_commit": TXN_EVERY, "scale": scale, "consume_passes": CONSUME_PASSES, "rounds": rounds, "quick": quick,
              "note": note or ("2-core shared machine: client processes and broker share both cores, so ratios "
                               "are what this box shows, not a capacity figure. The 16-core run is pending (no "
                               "16-core device machine in this session)."),
              "summary": summarise(rows, list(brokers)), "rows": rows, "semel_profile_top": prof}
    write_result(out_dir, name, result)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--before", type=Path, default=None, help="a semel source tree to run as 'before'")
    ap.add_argument("--earliest", type=Path, default=None,
                    help="a semel source tree to run as 'earliest' (the first measured commit), for CPU/GB ratios")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--case", action="append", default=None, help="only this case (repeatable)")
    ap.add_argument("--malloc-ab", action="store_true", help="also run this tree with glibc's malloc defaults")
    ap.add_argument("--name", default="hotpath", help="results file name (bench/results/NAME.json)")
    ap.add_argument("--variant", action="append", default=[],
                    help="'LABEL:NAME=VALUE,...': this tree with these environment settings (repeatable)")
    ap.add_argument("--variant-args", action="append", default=[],
                    help="'LABEL:BROKER ARGS': this tree with these `semel broker start` flags (repeatable)")
    ap.add_argument("--note", default=None, help="the results file's note")
    ap.add_argument("--warm-memory-gib", type=float, default=0.0,
                    help="touch this much memory before the brokers start (see warm_guest_memory)")
    ap.add_argument("--scale", type=float, default=None,
                    help="multiply every case's record count (longer runs: steadier CPU per GB)")
    a = ap.parse_args()
    run(a.out, a.quick, a.before, a.rounds, a.case, a.malloc_ab, a.name, a.variant, a.note, a.earliest,
        a.warm_memory_gib, a.scale, a.variant_args)

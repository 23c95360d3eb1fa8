"""Run examples/double.py under random SIGKILLs and verify exactly one output per input.

    python examples/double_chaos.py --bootstrap 127.0.0.1:9092 --inputs 2000 --kills 5 --seed 7

Exit status 0 only if every input n appears exactly once as 2n in the output
(read_committed), and nothing else does.
"""
from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

HERE = Path(__file__).resolve().parent


def create_topics(bootstrap, names, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for name, fut in admin.create_topics([NewTopic(n, partitions, 1) for n in names]).items():
        fut.result(15)


def produce_inputs(bootstrap, topic, count):
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    for i in range(count):
        p.produce(topic, key=str(i % 13).encode(), value=str(i).encode())
        p.poll(0)
    if p.flush(60):
        raise RuntimeError("inputs not acknowledged")


def read_outputs(bootstrap, topic, partitions, expect, idle_s=3.0):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "verifier", "isolation.level": "read_committed",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values = []
    last = time.monotonic()
    while time.monotonic() - last < idle_s:
        m = c.poll(0.2)
        if m is not None and not m.error():
            values.append(int(m.value()))
            last = time.monotonic()
            if len(values) >= expect:
                idle_s = 1.0
    c.close()
    return values


def verify(inputs: int, outputs: list[int]) -> list[str]:
    problems = []
    seen: dict[int, int] = {}
    for v in outputs:
        seen[v] = seen.get(v, 0) + 1
    dups = sorted(v for v, n in seen.items() if n > 1)
    missing = [i for i in range(inputs) if 2 * i not in seen]
    strays = sorted(v for v in seen if v % 2 or not 0 <= v // 2 < inputs)
    if dups:
        problems.append(f"{len(dups)} duplicated output(s), e.g. {dups[:5]}")
    if missing:
        problems.append(f"{len(missing)} input(s) without output, e.g. {missing[:5]}")
    if strays:
        problems.append(f"{len(strays)} output(s) matching no input, e.g. {strays[:5]}")
    return problems


def run(bootstrap, inputs, kills, seed, partitions=3, log=print) -> list[str]:
    rng = random.Random(seed)
    create_topics(bootstrap, ["numbers", "doubled"], partitions)
    produce_inputs(bootstrap, "numbers", inputs)
    cmd = [sys.executable, str(HERE / "double.py"), "--bootstrap", bootstrap, "--batch", "40"]
    for k in range(kills):
        proc = subprocess.Popen(cmd)
        time.sleep(rng.uniform(1.0, 4.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        log(f"kill {k + 1}/{kills}: SIGKILLed the worker")
    proc = subprocess.Popen(cmd + ["--idle-exit", "5"])
    if proc.wait(300) != 0:
        return [f"final worker exited with {proc.returncode}"]
    outputs = read_outputs(bootstrap, "doubled", partitions, inputs)
    log(f"{inputs} inputs, {len(outputs)} committed outputs")
    return verify(inputs, outputs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--inputs", type=int, default=2000)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    problems = run(a.bootstrap, a.inputs, a.kills, a.seed)
    for line in problems:
        print("FAIL:", line)
    print("exactly one output per input" if not problems else "exactly-once violated")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""SIGKILL of a Spark query at each step of the sink's commit cycle, then a restart
from the checkpoint: every input is in the output topic exactly once (checked by an
independent confluent-kafka read_committed consumer) and the source offsets the
broker holds for the query are the end of the input.

The query runs in its own process session (`python -m tests.spark.test_sink_crash`);
the sink's test-only hook SIGKILLs that session (driver and JVM) at the named step
of a seeded batch."""
from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from semel.client import Client
from semel.client import txn as wire
from semel.spark import sink
from semel.spark import hooks
from tests.spark.test_source import create, produce
from tests.support.consume import read_values

ROWS = 60
PER_TRIGGER = 20  # 3 batches


def run_query(bootstrap: str, src: str, dst: str, checkpoint: str, kill_at: str | None,
              master: str = "local[2]", fail_first_attempt: bool = False, atomic: str = "auto") -> int:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop(hooks.KILL_ENV, None)
    if kill_at:
        env[hooks.KILL_ENV] = kill_at
    if fail_first_attempt:
        env[hooks.FAIL_FIRST_ATTEMPT_ENV] = "1"
    proc = subprocess.run([sys.executable, "-m", "tests.spark.test_sink_crash", bootstrap, src, dst, checkpoint,
                           master, atomic], env=env, cwd=os.getcwd(),
                          start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    if proc.returncode not in (0, -9):
        print(proc.stdout.decode(errors="replace")[-5000:])
    return proc.returncode


def setup_topics(bs: str, name: str) -> tuple[str, str]:
    src, dst = f"{name}-in", f"{name}-out"
    create(bs, src, 2)
    create(bs, dst, 2)
    produce(bs, src, [f"a{i}" for i in range(ROWS // 2)], partition=0)
    produce(bs, src, [f"b{i}" for i in range(ROWS // 2)], partition=1)
    return src, dst


def check_exactly_once(bs: str, src: str, dst: str, ck: str) -> None:
    got = read_values(bs, dst, 2, want=ROWS)
    assert sorted(got) == sorted([f"out-a{i}" for i in range(ROWS // 2)] + [f"out-b{i}" for i in range(ROWS // 2)])
    o = sink.parse_options({"kafka.bootstrap.servers": bs, "checkpointLocation": ck})
    with Client(bs) as c:
        meta = wire.committed_with_metadata(c, o.group, [(src, 0), (src, 1)])
    assert {tp: off for tp, (off, _) in meta.items()} == {(src, 0): ROWS // 2, (src, 1): ROWS // 2}


SEED = 1
_ORDER = random.Random(SEED).sample(hooks.STEPS, len(hooks.STEPS))


@pytest.mark.parametrize("atomic,steps", [("true", _ORDER[:2]), ("false", _ORDER[2:])])
def test_sigkill_at_every_step_then_restart(spark_broker, tmp_path, atomic, steps):
    """A query killed at two steps of the commit cycle (seeded split of the four steps
    between mode (a) and mode (b), so each step is covered once), in batches 0 and 1;
    a step that follows the decision of a batch can only be reached in a later batch,
    so each kill gets its own batch. Then a clean run finishes the input."""
    bs = spark_broker.bootstrap
    src, dst = setup_topics(bs, f"crash-{atomic}")
    ck = str(tmp_path / "ck")
    for batch, step in enumerate(steps):
        assert run_query(bs, src, dst, ck, f"{step}@{batch}", atomic=atomic) == -9, f"not killed at {step}@{batch}"
    assert run_query(bs, src, dst, ck, None, atomic=atomic) == 0
    check_exactly_once(bs, src, dst, ck)


def test_failed_task_attempt_is_retried_and_fenced(spark_broker, tmp_path):
    """local[2,3], mode auto (a on semel): each task's first attempt produces all its rows,
    then raises (sink test hook); Spark retries it. Only the winning attempt's rows are visible."""
    bs = spark_broker.bootstrap
    src, dst = setup_topics(bs, "retry")
    ck = str(tmp_path / "ck")
    assert run_query(bs, src, dst, ck, None, master="local[2,3]", fail_first_attempt=True) == 0
    check_exactly_once(bs, src, dst, ck)
    # the failed attempts did produce (now aborted) rows: the test exercised a loser
    assert len(read_values(bs, dst, 2, isolation="read_uncommitted", want=ROWS + 1)) > ROWS


def _driver(bootstrap: str, src: str, dst: str, checkpoint: str, master: str, atomic: str) -> None:
    os.environ[hooks.KILL_PGID_ENV] = str(os.getpgid(0))
    from semel.spark import local_session
    spark = local_session(master, "semel-sink-crash", checkpoint + "-local")
    df = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bootstrap).option("subscribe", src)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(PER_TRIGGER)).load())
    w = df.selectExpr("key", "concat('out-', cast(value as string)) as value").writeStream.format("semel")
    q = (w.option("kafka.bootstrap.servers", bootstrap).option("topic", dst).option("semel.atomicBatches", atomic)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    q.awaitTermination()
    if q.exception() is not None:
        raise SystemExit(f"query failed: {q.exception()}")
    spark.stop()


if __name__ == "__main__":
    _driver(*sys.argv[1:7])

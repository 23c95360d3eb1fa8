"""Time from a broker restart to the first committed transaction, per
client library: an unmodified confluent-kafka, kafka-python or aiokafka
transactional producer (send_offsets_to_transaction in every transaction); the
broker is SIGKILLed at a seeded point of a transaction and restarted on the same
data directory; we time from the restarted broker listening to the next
transaction's commit returning (tests/support/restart_txn.py, the same scenario
as tests/integration/test_restart_txn_resume.py, exactness checked per case).

confluent-kafka runs with semel.eos.kafka.RESTART_SAFE_CONFIG; a few extra cases
with librdkafka's default (re-bootstrap) record how often its
send_offsets_to_transaction hangs instead (docs/librdkafka-restart-hang.md).

    python -m bench.restart_resume [--quick]
"""
from __future__ import annotations

import random
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, main, write_result  # noqa: E402
from tests.support import restart_txn  # noqa: E402

SEED = 1616


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))], 3)


def _cases(rng: random.Random, client: str, n: int) -> list[tuple[str, str, int]]:
    return [(client, rng.choice(restart_txn.POINTS), rng.randint(0, 50)) for _ in range(n)]


def _run(tmp: Path, label: str, cases: list[tuple[str, str, int]]) -> list[dict]:
    rows = []
    for i, (client, point, delay) in enumerate(cases):
        work = tmp / f"{label}-{i}"
        work.mkdir()
        r = restart_txn.run_case(client, point, delay, work)
        rows.append({"client": client, "point": point, "delay_ms": delay, "resume_s": r.resume_s,
                     "attempts": r.attempts, "hung": r.hung, "victim_committed": r.victim_committed,
                     "problems": r.check()})
        print(rows[-1], flush=True)
    return rows


def _summary(rows: list[dict]) -> dict:
    times = [r["resume_s"] for r in rows if r["resume_s"] is not None]
    return {"cases": len(rows), "committed": len(times), "hung": sum(bool(r["hung"]) for r in rows),
            "exact": sum(not r["problems"] for r in rows),
            "resume_p50_s": _percentile(times, 0.5), "resume_p99_s": _percentile(times, 0.99),
            "resume_max_s": _percentile(times, 1.0),
            "resume_mean_s": round(statistics.fmean(times), 3) if times else None}


def run(out_dir: Path = RESULTS, quick: bool = False) -> dict:
    per_client = 6 if quick else 20
    default_cases = 1 if quick else 2
    rng = random.Random(SEED)
    clients = {}
    with tempfile.TemporaryDirectory(prefix="semel-resume-") as tmp:
        for client in restart_txn.CLIENTS:
            rows = _run(Path(tmp), client, _cases(rng, client, per_client))
            clients[client] = {**_summary(rows), "rows": rows}
        # librdkafka's own default: re-bootstrap strands the group coordinator lookup.
        restart_txn.RESTART_SAFE_CONFIG, saved = {}, restart_txn.RESTART_SAFE_CONFIG
        try:
            rows = _run(Path(tmp), "ck-default", [("ck", "commit", rng.randint(0, 50)) for _ in range(default_cases)])
        finally:
            restart_txn.RESTART_SAFE_CONFIG = saved
        librdkafka_default = {**_summary(rows), "rows": rows}
    result = {
        "what": "seconds from the restarted broker listening to the next transaction (with "
                "send_offsets_to_transaction) committing, after a SIGKILL at a seeded point of a transaction",
        "seed": SEED, "quick": quick, "call_deadline_s": restart_txn.CALL_DEADLINE_S,
        "confluent_kafka_config": dict(restart_txn.RESTART_SAFE_CONFIG),
        "clients": clients,
        "confluent_kafka_librdkafka_default": librdkafka_default,
    }
    write_result(out_dir, "restart_resume", result)
    return result


if __name__ == "__main__":
    main(run)

"""Rolling restart under load: the longest produce stall while each broker of a 3-broker
cluster in turn is stopped with SIGTERM (controlled shutdown: its leaderships and
coordinators go to in-sync peers first), started again and back in every ISR.

The scenario is the test's (tests/support/rolling.py, checked by
tests/cluster/test_rolling_restart.py): an acks=all idempotent confluent-kafka producer
sending all the time and a transactional copier (read_committed, send_offsets_to_transaction)
running throughout. A stall is the longest time without a delivery report while the
restarts go on; each run's failed deliveries and copy exactness are recorded with it.

    python -m bench.rolling_restart [--quick]
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from bench.common import RESULTS, SHARED_BOX, load_fields, main, write_result


def _one(lease_ttl_s: int, handover: bool = True) -> dict:
    from semel.launch.local_cluster import LocalCluster
    from tests.support.cluster import wait_brokers
    from tests.support.rolling import rolling_restart
    with tempfile.TemporaryDirectory(prefix="semel-rolling-") as tmp:
        with LocalCluster(Path(tmp), 3, lease_ttl_s=lease_ttl_s,
                          broker_args=["--group-initial-rebalance-delay-ms", "0",
                                       *([] if handover else ["--controlled-shutdown-timeout-ms", "0"])]) as cluster:
            wait_brokers(cluster, {0, 1, 2})
            out = rolling_restart(cluster)
    row = {"lease_ttl_s": lease_ttl_s, "controlled_shutdown": handover, **out.summary()}
    print(row, flush=True)
    return row


def _phase_max(rows: list[dict], key: str) -> float:
    return max(x[key] for r in rows for x in r["restarts"])


def run(out_dir: Path = RESULTS, quick: bool = False) -> dict:
    ttls = [6] if quick else [6, 6, 6]
    load_start = os.getloadavg()
    rows = [_one(ttl) for ttl in ttls]
    stalls = [r["longest_produce_stall_s"] for r in rows]
    # The same with the handover cut to nothing (timeout 0): the stopping broker leaves
    # its session at once and the controller elects, as after a crash with a revoked lease.
    baseline = [_one(ttl, handover=False) for ttl in ttls[:1 if quick else 2]]
    result = {
        "what": ("longest time without an acks=all delivery report during a rolling restart (SIGTERM, start, "
                 "back in every ISR) of all three brokers, under an idempotent producer and a transactional "
                 "copier; failed deliveries and copy exactness of each run"),
        "cluster": ("etcd + 3 semel broker processes on this machine (semel.launch.local_cluster), default lease TTL, "
                    "topics RF3 with min.insync.replicas 2, internal topics RF3"),
        "client": ("confluent-kafka: an idempotent acks=all producer (linger.ms 5) sending round-robin to 3 "
                   "partitions all the time; a transactional copier (tests/support/copier.py) with "
                   "metadata.recovery.strategy none and the watchdog for librdkafka's hang"),
        "settings": {"runs": len(rows), "quick": quick},
        "summary": {"longest_produce_stall_s_max": max(stalls), "longest_produce_stall_s_each": stalls,
                    "failed_deliveries": sum(r["failed_deliveries"] for r in rows),
                    "copies_exact": all(r["copy_exact"] for r in rows),
                    "without_handover_longest_produce_stall_s_each":
                        [r["longest_produce_stall_s"] for r in baseline],
                    "longest_stall_while_stopping_s_max": _phase_max(rows, "longest_stall_stopping_s"),
                    "without_handover_longest_stall_while_stopping_s_max":
                        _phase_max(baseline, "longest_stall_stopping_s"),
                    "longest_stall_while_restarting_s_max": _phase_max(rows, "longest_stall_restarting_s")},
        "note": ("A run's stall is split by phase in each restart: while the broker stops (SIGTERM to exit: "
                 "the hand-over) and while it comes back (start to every ISR full again). Without the "
                 "hand-over (--controlled-shutdown-timeout-ms 0) the stopping broker still revokes its "
                 "session, so the controller elects at once; the difference is in the stopping phase. The "
                 "box is shared and loaded (load average below): single runs vary by a second."),
        "machine_name": SHARED_BOX,
        **load_fields(load_start),
        "rows": rows + baseline,
    }
    write_result(out_dir, "rolling_restart", result)
    print(f"rolling restart {result['summary']}")
    return result


if __name__ == "__main__":
    main(run)

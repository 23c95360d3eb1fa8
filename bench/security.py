"""Produce throughput with security on vs off, one run (issue 12's target: >= 0.9).

Two semel brokers side by side: one plain (PLAINTEXT, no ACLs) and one secured
(SASL_SSL listener, SCRAM-SHA-512 login, authorizer on with a few hundred ACLs, the
producer allowed by a prefixed ACL). Same confluent-kafka producer settings, acks=all,
rounds alternated between the two so machine noise hits both; the median round
counts. Writes bench/results/security.json.

    python -m bench.security [--quick]
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import RESULTS, main, write_result
from bench.throughput_bench import produce
from semel.cli.process import SemelBroker, free_port, wait_for_port

PASSWORD = "bench-secret"


def _certs(d: Path) -> tuple[Path, Path, Path]:
    from tests.support.certs import make_certs
    return make_certs(d)


def _semel(*args, data_dir: Path, env=None) -> None:
    import os
    subprocess.run([sys.executable, "-m", "semel", *args, "--data-dir", str(data_dir)], check=True,
                   capture_output=True, env=dict(os.environ, **(env or {})))


def _produce(conf: dict, topic: str, size: int, count: int) -> float:
    return produce(conf["bootstrap.servers"], topic, 1, size, count, conf)


def _create(conf: dict, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)


def run(out_dir: Path = RESULTS, quick: bool = False) -> dict:
    size, count, rounds = 1024, (20_000 if quick else 100_000), (3 if quick else 5)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ca, cert, key = _certs(tmp)
        sdata = tmp / "secure"
        sdata.mkdir()
        for user in ("admin", "writer"):
            _semel("user", "add", user, "--password-env", "PW", data_dir=sdata, env={"PW": PASSWORD})
        _semel("acl", "add", "--allow", "User:writer", "--operation", "write", "--topic", "bench-", "--prefixed",
               data_dir=sdata)
        _semel("acl", "add", "--allow", "User:writer", "--operation", "idempotent-write", "--cluster",
               data_dir=sdata)
        from semel.broker.auth.acl import AclBinding, AclStore, Operation, PatternType, Permission, ResourceType
        AclStore(sdata).add([AclBinding(ResourceType.TOPIC, f"other-{i}", PatternType.LITERAL, f"User:u{i}", "*",
                                        Operation.READ, Permission.ALLOW) for i in range(300)])
        tls_port = free_port()
        plain = SemelBroker(tmp / "plain", log_path=tmp / "plain.log").start()
        secure = SemelBroker(sdata, log_path=tmp / "secure.log", extra_args=[
            "--listener", f"SASL_SSL://127.0.0.1:{tls_port}", "--ssl-certfile", str(cert),
            "--ssl-keyfile", str(key), "--super-user", "User:admin"]).start()
        try:
            wait_for_port("127.0.0.1", tls_port, 60)
            confs = {
                "plain": {"bootstrap.servers": plain.bootstrap},
                "sasl_scram_tls_acls": {"bootstrap.servers": f"127.0.0.1:{tls_port}", "security.protocol": "SASL_SSL",
                                        "ssl.ca.location": str(ca), "sasl.mechanism": "SCRAM-SHA-512",
                                        "sasl.username": "writer", "sasl.password": PASSWORD},
            }
            admin_conf = {**confs["sasl_scram_tls_acls"], "sasl.username": "admin"}
            _create(confs["plain"], "bench-t")
            _create(admin_conf, "bench-t")
            times: dict[str, list[float]] = {k: [] for k in confs}
            for r in range(rounds):
                order = list(confs) if r % 2 == 0 else list(reversed(confs))
                for name in order:
                    times[name].append(_produce(confs[name], "bench-t", size, count))
        finally:
            plain.close()
            secure.close()
    rate = {k: count / statistics.median(v) for k, v in times.items()}
    result = {
        "what": "confluent-kafka produce, acks=all, 1 KiB records, 1 partition, flush=always; rounds alternated",
        "records_per_round": count, "record_bytes": size, "rounds": rounds,
        "seconds_per_round": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "records_per_s_median": {k: round(v) for k, v in rate.items()},
        "ratio_secure_to_plain": round(rate["sasl_scram_tls_acls"] / rate["plain"], 3),
        "target_ratio": 0.9,
        "acls_in_store": 302,
    }
    result["meets_target"] = result["ratio_secure_to_plain"] >= 0.9
    path = write_result(out_dir, "security", result)
    print(path.read_text())
    return result


if __name__ == "__main__":
    main(run)

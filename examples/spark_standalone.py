"""Scale-out of the demo (issue 10 point 6): a Spark standalone cluster (one master,
two workers, started from the pyspark installation's spark-class) on this machine,
and the unchanged demo job submitted to it with its crashes and verifier.

    python examples/spark_standalone.py [--workers 2] [semel demo options ...]

e.g. `python examples/spark_standalone.py --records 2000 --crashes 2`. Everything
else `semel demo` accepts passes through; `--master` is set to the cluster. The
cluster stops when the demo ends; the exit status is the demo's.

`--hide-from-workers DIR` runs the workers (and so their executors) in their own
mount namespace with an empty tmpfs over DIR, as on a cluster whose nodes cannot
see the driver's disk: with DIR the demo's checkpoint directory (`--data-dir
WORK --hide-from-workers WORK/ck`) no task can read a checkpoint."""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REGISTERED = "Registering worker"
START_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_class() -> str:
    import pyspark
    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


# The worker's command runs in a new mount namespace (util-linux unshare, which needs
# root or CAP_SYS_ADMIN) after an empty tmpfs is mounted over the hidden directory
# there; exec keeps the one pid, so /proc/PID/root shows the worker's view.
HIDE = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
        'mount -t tmpfs -o size=1m semel-hidden "$0" && exec "$@"']
MARKER = ".driver-only"


def daemon(cls: str, args: list[str], log: Path, hide: Path | None = None) -> subprocess.Popen:
    env = dict(os.environ, SPARK_NO_DAEMONIZE="1", PYSPARK_PYTHON=sys.executable)
    cmd = [spark_class(), cls, *args]
    if hide is not None:
        cmd = [*HIDE, str(hide), *cmd]
    with open(log, "wb") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def check_hidden(procs: list[subprocess.Popen], hide: Path) -> None:
    """The driver sees MARKER in `hide`; no worker does (its view through /proc)."""
    for p in procs:
        seen = os.listdir(f"/proc/{p.pid}/root{hide.resolve()}")
        if MARKER in seen:
            raise SystemExit(f"worker {p.pid} can see {hide}")


def start_cluster(root: Path, workers: int, own_hosts: bool = False,
                  hide: Path | None = None) -> tuple[str, list[subprocess.Popen]]:
    """A master and `workers` workers of one core each. own_hosts: worker i binds
    127.0.0.{i+1}, so Spark takes the workers for different hosts (it never runs a
    speculative copy of a task on a host that already runs an attempt of it).
    hide: a directory the workers and their executors cannot see (an empty tmpfs
    over it in their own mount namespace)."""
    if hide is not None:
        hide.mkdir(parents=True, exist_ok=True)
        (hide / MARKER).touch()
    port = free_port()
    master_log = root / "master.log"
    procs = [daemon("org.apache.spark.deploy.master.Master",
                    ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())], master_log)]
    url = f"spark://127.0.0.1:{port}"
    for i in range(workers):
        work = root / f"worker-{i}"
        work.mkdir(parents=True, exist_ok=True)
        host = f"127.0.0.{i + 1}" if own_hosts else "127.0.0.1"
        procs.append(daemon("org.apache.spark.deploy.worker.Worker",
                            ["--host", host, "--cores", "1", "--memory", "1g", "--work-dir", str(work),
                             "--webui-port", str(free_port()), url], root / f"worker-{i}.log", hide))
    deadline = time.monotonic() + START_TIMEOUT_S
    while master_log.read_text(errors="replace").count(REGISTERED) < workers:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            stop_cluster(procs)
            raise SystemExit(f"the Spark cluster did not start: see {root}/*.log")
        time.sleep(0.5)  # polling the master's log for the registrations
    if hide is not None:
        try:
            check_hidden(procs[1:], hide)
        except BaseException:
            stop_cluster(procs)
            raise
    return url, procs


def stop_cluster(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            os.killpg(p.pid, 15)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cluster-dir", type=Path, default=None, help="logs and worker dirs (default: a temp dir)")
    ap.add_argument("--hide-from-workers", type=Path, default=None, metavar="DIR",
                    help="a directory the workers cannot see (their own mount namespace; needs root)")
    a, demo_args = ap.parse_known_args(argv)
    root = a.cluster_dir or Path(tempfile.mkdtemp(prefix="semel-spark-cluster-"))
    root.mkdir(parents=True, exist_ok=True)
    url, procs = start_cluster(root, a.workers, hide=a.hide_from_workers)
    print(f"Spark standalone cluster at {url}: {a.workers} workers (logs in {root})", flush=True)
    if a.hide_from_workers is not None:
        print(f"the workers cannot see {a.hide_from_workers}", flush=True)
    try:
        return subprocess.call([sys.executable, "-m", "semel.cli.main", "demo", "--master", url, *demo_args])
    finally:
        stop_cluster(procs)


if __name__ == "__main__":
    sys.exit(main())

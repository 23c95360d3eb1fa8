"""`semel bench [--quick]`: run every benchmark and write JSON results and PNG plots."""
from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path

from .main import CliError

# module under bench/ -> what it measures
BENCHMARKS = {
    "throughput_bench": "produce/consume throughput, semel (fsync) vs Tansu (memory)",
    "hotpath_bench": "broker hot path: 1x1/4x8 idempotent and transactional vs Tansu, CPU s/GB, py-spy profile",
    "txn_bench": "transactional overhead, read_committed overhead, memory per transactional id",
    "restart_bench": "partition log recovery time against log size",
    "broker_restart_bench": "broker process restart time against log size (clean stop and SIGKILL)",
    "eos_bench": "commit-cycle overhead per sink",
    "failover_bench": "cluster: leader SIGKILL to the producer's next acknowledged write, per lease TTL",
    "latency_bench": "publish and end-to-end latency at fixed rates: semel always/interval vs Tansu, RF3, transactions",
    "consume_small_bench": "reading 100 B records back, semel vs Tansu: consumer and broker CPU, py-spy of both",
    "restart_resume": "broker SIGKILL + restart to the next committed transaction, per client library",
}


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="run the benchmarks, write results (JSON) and plots (PNG)")
    p.add_argument("--quick", action="store_true", help="smaller sizes (a few minutes in all)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default: bench/results)")
    p.add_argument("--only", action="append", default=None, choices=sorted(BENCHMARKS),
                   help="run just this benchmark (repeatable)")
    p.set_defaults(func=run)


def _repo_root() -> Path:
    root = Path(__file__).resolve().parents[2]
    if not (root / "bench").is_dir():
        raise CliError(f"benchmarks live in the source tree; no bench/ folder under {root}")
    return root


def run(args) -> int:
    from .optional import require
    require("matplotlib", "semel bench's plots")   # before the benchmarks run, not after
    root = _repo_root()
    sys.path.insert(0, str(root))
    out = args.out or root / "bench" / "results"
    names = args.only or list(BENCHMARKS)
    summary = {}
    for name in names:
        try:
            mod = importlib.import_module(f"bench.{name}")
        except ModuleNotFoundError:
            print(f"skip {name}: not present", file=sys.stderr)
            continue
        print(f"== {name}: {BENCHMARKS[name]}", flush=True)
        t0 = time.perf_counter()
        try:
            summary[name] = {"seconds": round(time.perf_counter() - t0, 1), "result": mod.run(out, args.quick)}
        except Exception as exc:  # one failing benchmark should not hide the others
            print(f"{name} failed: {exc!r}", file=sys.stderr)
            summary[name] = {"error": repr(exc)}
        summary[name]["seconds"] = round(time.perf_counter() - t0, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    _plots(out, summary)
    print(f"results in {out}")
    return 1 if any("error" in v for v in summary.values()) else 0


def _plots(out: Path, summary: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tp = summary.get("throughput_bench", {}).get("result")
    if tp:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, key, title in ((axes[0], "produce_rec_s", "produce"), (axes[1], "consume_rec_s", "consume")):
            cases = sorted({(r["record_bytes"], r["partitions"]) for r in tp["rows"]})
            labels = [f"{s} B x{p}" for s, p in cases]
            for i, broker in enumerate(sorted({r["broker"] for r in tp["rows"]})):
                vals = [next((r[key] for r in tp["rows"] if r["broker"] == broker
                              and (r["record_bytes"], r["partitions"]) == c), 0) for c in cases]
                ax.bar([x + i * 0.4 for x in range(len(cases))], vals, width=0.4, label=broker)
            ax.set_xticks([x + 0.2 for x in range(len(cases))], labels)
            ax.set_title(f"{title} records/s (acks=all)")
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=110)
        plt.close(fig)
    txn = summary.get("txn_bench", {}).get("result")
    if txn:
        rows = [r for r in txn["produce"] if "commit_interval_ms" in r]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([r["commit_interval_ms"] for r in rows], [r["ratio_to_idempotent"] for r in rows], marker="o")
        ax.axhline(0.97, linestyle="--", color="grey", label="3% loss")
        ax.set_xscale("log")
        ax.set_xlabel("commit interval (ms)")
        ax.set_ylabel("transactional / idempotent throughput")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "transactions.png", dpi=110)
        plt.close(fig)

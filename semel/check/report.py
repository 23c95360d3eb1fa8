"""Outputs of a check: a readable report, a JSON summary and a PNG of offsets over time."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .analyses import ANALYSES, unseen_series
from .facts import READ_COMMITTED, isolation_of

EXPLAIN = {
    "aborted-read": "read_committed polls returned records of aborted transactions",
    "lost-write": "committed records that readers moved past without ever returning",
    "duplicate": "values found at more than one offset (or in more than one partition)",
    "inconsistent-offsets": "offsets that held more than one value",
    "torn-transaction": "transactions partly visible: some records read, others passed over",
    "precommitted-read": "records read before their transaction asked to commit",
    "poll-skip": "a consumer jumped over records it should have returned",
    "nonmonotonic-poll": "a consumer went back (or repeated) without a reassignment",
    "nonmonotonic-send": "a producer got a lower offset for a later send to a partition",
    "G0": "write cycles between non-overlapping transactions",
    "G1c": "cycles through read dependencies (each transaction saw the other first)",
    "unseen": "acknowledged records no read_committed reader returned by the end",
    "unexpected-value": "polls returned values nobody sent to that partition",
    "incomplete": "fence or final drain did not finish (broker stuck or gone): verdict inconclusive",
}
EXAMPLES = 3


def _op(ref: dict) -> str:
    return f"op #{ref['index']} (process {ref['process']}, {ref['f']} {ref['type']}, t={ref['time'] / 1e9:.3f}s)"


def describe_case(name: str, c: dict) -> str:
    """One line per case, in words."""
    if name == "aborted-read":
        return (f"key {c['key']} offset {c['offset']} value {c['value']}: written by {_op(c['writer'])}, "
                f"read by {_op(c['reader'])}")
    if name == "lost-write":
        return (f"key {c['key']} offset {c['offset']} value {c['value']} ({_op(c['writer'])}) never read at "
                f"{c['isolation']}, though {_op(c['read_past_by'])} read offset {c['read_past_offset']}")
    if name == "duplicate":
        if "keys" in c:
            return f"value {c['value']} sent to keys {c['keys']}"
        return f"key {c['key']} value {c['value']} at offsets {c['offsets']}"
    if name == "inconsistent-offsets":
        return f"key {c['key']} offset {c['offset']} holds values {c['values']}"
    if name == "torn-transaction":
        return (f"{_op(c['writer'])}: read {c['seen_count']} records (e.g. {c['seen'][0]}), passed over "
                f"{c['passed_over_count']} (e.g. key/value/offset {c['passed_over'][0]})")
    if name == "precommitted-read":
        if c["kind"] == "own-write":
            return f"{_op(c['op'])} read its own key {c['key']} value {c['value']} before committing"
        return (f"key {c['key']} value {c['value']} read by {_op(c['reader'])} before the writer "
                f"{_op(c['writer'])} asked to commit (t={c['commit_ns'] / 1e9:.3f}s)")
    if name in ("poll-skip", "nonmonotonic-poll", "nonmonotonic-send"):
        where = "within one op" if c["within_op"] else "between ops " + ", ".join(_op(o) for o in c["ops"])
        tail = f"; skipped {c['skipped']['count']} e.g. {c['skipped']['values'][:3]}" if "skipped" in c else ""
        return (f"process {c['process']} key {c['key']}: offset/value {c['from']} then {c['to']} "
                f"{where}{tail}")
    if name in ("G0", "G1c"):
        steps = c["steps"]
        hops = " -> ".join(f"#{s['from']['index']} -{s['edge']}[k{s['key']}]" for s in steps)
        return f"{hops} -> #{steps[-1]['to']['index']}"
    if name == "unseen":
        return f"key {c['key']} offset {c['offset']} value {c['value']} from {_op(c['writer'])}"
    if name == "incomplete":
        return f"{c['what']} at t={c['time'] / 1e9:.3f}s: {json.dumps(c['detail'])}"
    if name == "unexpected-value":
        return f"key {c['key']} offset {c['offset']} value {c['value']} read by {_op(c['reader'])}"
    return json.dumps(c)[:200]


def text_report(result: dict, run: dict | None = None) -> str:
    counts = result["anomaly_counts"]
    st = result["stats"]
    lines = []
    verdict = "VALID: no anomaly found" if result["valid"] else \
        "INVALID: " + ", ".join(f"{n} ({counts[n]})" for n in ANALYSES if counts.get(n))
    lines.append(f"semel check: {verdict}")
    if run:
        for key in ("bootstrap", "topic", "seed", "mode", "duration_s", "faults", "history"):
            if key in run:
                lines.append(f"  {key:<11} {run[key]}")
        if run.get("cluster"):
            c = run["cluster"]
            lines.append(f"  cluster     {c['nodes']} brokers, controller {c['controller']}, leader epochs "
                         f"{c['epochs_start']} -> {c['epochs_end']}, episodes {c['episodes']}")
    lines.append(f"  ops         {', '.join(f'{k} {v}' for k, v in st['ops'].items())}")
    lines.append(f"  values      sent {st['values_sent']}, acknowledged {st['values_acknowledged']}, "
                 f"reads rc {st['reads_read_committed']}, ru {st['reads_read_uncommitted']}")
    if st.get("longest_commit_gap_s"):
        lines.append(f"  liveness    longest stretch without a committed transaction: {st['longest_commit_gap_s']}s")
    if st["faults"]:
        lines.append(f"  faults      {', '.join(f'{k} {v}' for k, v in st['faults'].items())}")
    trouble = {k: v for k, v in st.get("controller_events", {}).items() if k not in ("setup", "heal", "end", "fenced", "cluster-view")}
    if trouble:
        lines.append(f"  trouble     {', '.join(f'{k} {v}' for k, v in trouble.items())}")
    lines.append("")
    for name in ANALYSES:
        n = counts.get(name, 0)
        mark = "FOUND" if n else "ok"
        lines.append(f"  {name:<21} {mark:>5} {n:>7}  {EXPLAIN[name]}")
        for case in result["anomalies"].get(name, [])[:EXAMPLES]:
            lines.append(f"      - {describe_case(name, case)}")
    lines.append("")
    lines.append(verdict)
    return "\n".join(lines) + "\n"


def summary_json(result: dict, run: dict | None = None) -> dict:
    out = {k: v for k, v in result.items() if not k.startswith("_")}
    if run:
        out["run"] = run
    return out


def _atomic_write(path: Path, data: bytes) -> None:
    """Write next to the target, then rename: never a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def write_outputs(result: dict, out_dir: Path, run: dict | None = None, plot: bool = True) -> dict:
    """report.txt, summary.json and offsets.png in out_dir; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"report": out_dir / "report.txt", "summary": out_dir / "summary.json"}
    _atomic_write(paths["report"], text_report(result, run).encode())
    _atomic_write(paths["summary"], (json.dumps(summary_json(result, run), indent=1, default=str) + "\n").encode())
    if plot:
        paths["plot"] = out_dir / "offsets.png"
        plot_offsets(result, paths["plot"])
    return {k: str(v) for k, v in paths.items()}


# ---------------------------------------------------------------- plot

MAX_KEYS_PLOTTED = 8
FAULT_COLORS = {"kill-broker": "#d62728", "disk-full": "#8c564b", "slow-fsync": "#bcbd22",
                "kill-client": "#9467bd", "pause-client": "#17becf",
                "kill-leader": "#e377c2", "kill-follower": "#ff7f0e", "pause-broker": "#7f7f7f"}


def _anomaly_points(result: dict) -> list:
    """(key, time_s, offset, class) of anomalies that have a place on the plot."""
    pts = []
    for name, cases in result.get("_all_anomalies", result["anomalies"]).items():
        for c in cases[:2000]:
            key, offset = c.get("key"), c.get("offset")
            if offset is None and isinstance(c.get("to"), list):
                offset = c["to"][0]
            ref = (c.get("reader") or c.get("op") or c.get("read_past_by") or c.get("writer")
                   or (c.get("ops") or [None])[-1])
            if key is not None and offset is not None and ref is not None:
                pts.append((key, ref["time"] / 1e9, offset, name))
    return pts


def plot_offsets(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    facts = result["_facts"]
    keys = sorted(facts.log, key=str)[:MAX_KEYS_PLOTTED] or [0]
    fig, axes = plt.subplots(len(keys) + 1, 1, figsize=(12, 2.2 * (len(keys) + 1) + 0.6), sharex=True,
                             squeeze=False)
    axes = [a[0] for a in axes]
    sends = {k: {"ok": ([], []), "fail": ([], []), "info": ([], [])} for k in keys}
    reads = {k: {"rc": ([], []), "ru": ([], [])} for k in keys}
    for op in facts.history.ops:
        t = op.time / 1e9
        for s in op.sends:
            if s.key in sends and s.offset is not None:
                xs, ys = sends[s.key][op.type]
                xs.append(t)
                ys.append(s.offset)
        if op.reads:
            iso = "rc" if isolation_of(op) == READ_COMMITTED else "ru"
            # Per op and key, the range read: two points keep the plot light.
            for key, rs in op.reads_by_key().items():
                if key in reads:
                    xs, ys = reads[key][iso]
                    for off in {rs[0].offset, rs[-1].offset}:
                        xs.append(t)
                        ys.append(off)
    anomalies = _anomaly_points(result)
    faults = [e for e in facts.history.events if e.get("process") == "nemesis" and e.get("type") == "invoke"]
    for ax, key in zip(axes, keys):
        style = {"ok": ("o", "#2ca02c", "sent, committed"), "fail": ("x", "#ff7f0e", "sent, aborted"),
                 "info": ("s", "#7f7f7f", "sent, unknown")}
        for typ, (marker, color, label) in style.items():
            xs, ys = sends[key][typ]
            if xs:
                ax.scatter(xs, ys, s=6, marker=marker, color=color, label=label, linewidths=0.6)
        for iso, color, label in (("rc", "#1f77b4", "read, read_committed"),
                                  ("ru", "#aec7e8", "read, read_uncommitted")):
            xs, ys = reads[key][iso]
            if xs:
                ax.scatter(xs, ys, s=3, color=color, label=label, alpha=0.5)
        bad = [(t, o, n) for k, t, o, n in anomalies if k == key]
        if bad:
            ax.scatter([b[0] for b in bad], [b[1] for b in bad], s=60, marker="X", color="red",
                       label="anomaly", zorder=5)
        for ev in faults:
            ax.axvline(ev["time"] / 1e9, color=FAULT_COLORS.get(ev["f"], "#cccccc"), lw=0.6, alpha=0.6)
        ax.set_ylabel(f"key {key}\noffset")
    axes[0].legend(loc="upper left", fontsize=7, ncol=4)
    series = unseen_series(facts)
    if series:
        axes[-1].plot([t / 1e9 for t, _ in series], [sum(c.values()) for _, c in series], color="#d62728", lw=1)
    axes[-1].set_ylabel("unseen\n(ack'd, unread)")
    axes[-1].set_xlabel("time since start (s)")
    counts = result["anomaly_counts"]
    title = "valid" if result["valid"] else "INVALID: " + ", ".join(
        f"{n} {counts[n]}" for n in ANALYSES if counts.get(n))
    fig.suptitle(f"semel check: offsets over time ({title}); vertical lines: faults", fontsize=10)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)

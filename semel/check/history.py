"""The history of a check run: one JSON object per line, one line per event.

The shape follows Jepsen's queue workload so that its analyses carry over:
each client process invokes one operation at a time and later completes it as
`ok` (it happened), `fail` (it certainly did not happen) or `info` (unknown:
the process crashed, or the broker gave an indefinite answer).

    {"index": 7, "time": 81233000, "process": 2, "type": "invoke", "f": "txn",
     "value": [["send", 0, 1007], ["send", 3, 1008], ["poll"]]}
    {"index": 9, "time": 95120000, "process": 2, "type": "ok", "f": "txn",
     "value": [["send", 0, [41, 1007]], ["send", 3, [12, 1008]],
               ["poll", {"1": [[5, 1001], [7, 1002]]}]],
     "isolation": "read_committed", "commit_ns": 94000000}

Keys are partition numbers of the check topic (JSON object keys are strings;
they are turned back into ints here). Values are integers unique in a run.
`time` and `commit_ns` are nanoseconds since the run started, on one
monotonic clock shared by every process of the machine.

Optional fields the analyses use:
  isolation   "read_committed" | "read_uncommitted": how the op's polls read
  commit_ns   when the client asked the broker to commit this transaction
  rebalance   list of key lists reassigned to the consumer during the op
              (a group rebalance: positions restart from committed offsets)
Events of process "nemesis" describe injected faults; analyses skip them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

TYPES = ("invoke", "ok", "fail", "info")
READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
ISOLATIONS = (READ_COMMITTED, READ_UNCOMMITTED)
NEMESIS = "nemesis"


class HistoryError(ValueError):
    """A history line that cannot be understood; the message names the line."""


@dataclass(frozen=True)
class Send:
    key: Any
    value: int
    offset: int | None  # None: the client never learned where it landed


@dataclass(frozen=True)
class Read:
    key: Any
    offset: int
    value: int


@dataclass
class Op:
    """One completed operation, joined with its invocation."""

    index: int                     # index of the completion event
    process: Any
    type: str                      # ok | fail | info
    f: str
    invoke_time: int
    time: int                      # completion time; for info it is when we gave up
    mops: list = field(default_factory=list)  # [("send", Send) | ("poll", [Read, ...])]
    isolation: str | None = None
    commit_ns: int | None = None
    rebalance: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def sends(self) -> list[Send]:
        return [m for kind, m in self.mops if kind == "send"]

    @property
    def reads(self) -> list[Read]:
        return [r for kind, m in self.mops if kind == "poll" for r in m]

    def reads_by_key(self) -> dict:
        out: dict = {}
        for r in self.reads:
            out.setdefault(r.key, []).append(r)
        return out

    def ref(self) -> dict:
        """A short JSON-able pointer to this op for anomaly reports."""
        return {"index": self.index, "process": self.process, "type": self.type, "f": self.f,
                "time": self.time}


@dataclass
class History:
    events: list[dict]             # every event, as parsed (nemesis included)
    ops: list[Op]                  # completed client ops, in completion order

    def by_process(self) -> dict:
        out: dict = {}
        for op in self.ops:
            out.setdefault(op.process, []).append(op)
        return out


# ---------------------------------------------------------------- parsing

def _key(raw, where: str):
    if isinstance(raw, bool):
        raise HistoryError(f"{where}: key must be an integer or string, got {raw!r}")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw)
        except ValueError:
            return raw
    raise HistoryError(f"{where}: key must be an integer or string, got {raw!r}")


def _int(raw, what: str, where: str, allow_none: bool = False) -> int | None:
    if raw is None and allow_none:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise HistoryError(f"{where}: {what} must be an integer, got {raw!r}")
    return raw


def _parse_send(mop: list, completed: bool, where: str) -> Send:
    if len(mop) != 3:
        raise HistoryError(f"{where}: send must be [\"send\", key, value], got {mop!r}")
    key = _key(mop[1], where)
    body = mop[2]
    if completed and isinstance(body, list):
        if len(body) != 2:
            raise HistoryError(f"{where}: completed send must carry [offset, value], got {body!r}")
        return Send(key, _int(body[1], "value", where), _int(body[0], "offset", where, allow_none=True))
    return Send(key, _int(body, "value", where), None)


def _parse_poll(mop: list, where: str) -> list[Read]:
    if len(mop) == 1:
        return []
    if len(mop) != 2 or not isinstance(mop[1], dict):
        raise HistoryError(f"{where}: poll must be [\"poll\"] or [\"poll\", {{key: [[offset, value], ...]}}]")
    reads = []
    for raw_key, pairs in mop[1].items():
        key = _key(raw_key, where)
        if not isinstance(pairs, list):
            raise HistoryError(f"{where}: poll of key {raw_key} must be a list of [offset, value]")
        for pair in pairs:
            if not isinstance(pair, list) or len(pair) != 2:
                raise HistoryError(f"{where}: poll of key {raw_key} has {pair!r}, not [offset, value]")
            reads.append(Read(key, _int(pair[0], "offset", where), _int(pair[1], "value", where)))
    return reads


def parse_mops(value, completed: bool, where: str) -> list:
    if not isinstance(value, list):
        raise HistoryError(f"{where}: value of a send/poll/txn op must be a list of micro-ops")
    out = []
    for mop in value:
        if not isinstance(mop, list) or not mop or mop[0] not in ("send", "poll"):
            raise HistoryError(f"{where}: micro-op must be [\"send\", ...] or [\"poll\", ...], got {mop!r}")
        if mop[0] == "send":
            out.append(("send", _parse_send(mop, completed, where)))
        else:
            out.append(("poll", _parse_poll(mop, where)))
    return out


def _check_event(ev, n: int) -> None:
    where = f"history line {n}"
    if not isinstance(ev, dict):
        raise HistoryError(f"{where}: expected a JSON object")
    for name in ("process", "type", "f"):
        if name not in ev:
            raise HistoryError(f"{where}: missing field {name!r}")
    if ev["type"] not in TYPES:
        raise HistoryError(f"{where}: type must be one of {', '.join(TYPES)}, got {ev['type']!r}")
    if not isinstance(ev["f"], str):
        raise HistoryError(f"{where}: f must be a string")
    _int(ev.get("time", 0), "time", where)
    iso = ev.get("isolation")
    if iso is not None and iso not in ISOLATIONS:
        raise HistoryError(f"{where}: isolation must be read_committed or read_uncommitted, got {iso!r}")


DATA_FS = ("send", "poll", "txn")


def build(events: Iterable[dict]) -> History:
    """Join invocations with completions; validate as we go."""
    events = list(events)
    pending: dict = {}
    ops: list[Op] = []
    for n, ev in enumerate(events, 1):
        _check_event(ev, n)
        ev.setdefault("index", n - 1)
        ev.setdefault("time", 0)
        proc = ev["process"]
        if proc == NEMESIS:
            continue
        where = f"history line {n}"
        if ev["type"] == "invoke":
            if proc in pending:
                raise HistoryError(f"{where}: process {proc} invoked a new op before completing "
                                   f"the one of line {pending[proc][0]}")
            pending[proc] = (n, ev)
            continue
        start = pending.pop(proc, None)
        if start is None:
            raise HistoryError(f"{where}: completion for process {proc} without an invocation")
        inv = start[1]
        if inv["f"] != ev["f"]:
            raise HistoryError(f"{where}: completes f={ev['f']!r} but line {start[0]} invoked f={inv['f']!r}")
        ops.append(_make_op(inv, ev, where))
    # An op still pending at the end never completed: its effect is unknown.
    for proc, (n, inv) in pending.items():
        ev = dict(inv, type="info", index=len(events) + n, time=max(e.get("time", 0) for e in events))
        ops.append(_make_op(inv, ev, f"history line {n}"))
    return History(events, ops)


def _make_op(inv: dict, ev: dict, where: str) -> Op:
    f = ev["f"]
    mops = []
    if f in DATA_FS:
        # Completions carry results; an info completion may only repeat the invocation.
        completed = ev["type"] != "invoke"
        value = ev.get("value", inv.get("value"))
        mops = parse_mops(value if value is not None else [], completed, where)
    rebalance = ev.get("rebalance") or []
    if not isinstance(rebalance, list) or not all(isinstance(r, list) for r in rebalance):
        raise HistoryError(f"{where}: rebalance must be a list of key lists")
    commit_ns = _int(ev.get("commit_ns"), "commit_ns", where, allow_none=True)
    extra = {k: v for k, v in ev.items() if k not in
             ("index", "time", "process", "type", "f", "value", "isolation", "commit_ns", "rebalance")}
    if f in ("assign", "subscribe"):
        extra["keys"] = [_key(k, where) for k in (ev.get("value") or inv.get("value") or [])]
    return Op(index=ev["index"], process=ev["process"], type=ev["type"], f=f,
              invoke_time=inv.get("time", 0), time=ev["time"], mops=mops,
              isolation=ev.get("isolation", inv.get("isolation")), commit_ns=commit_ns,
              rebalance=[[_key(k, where) for k in r] for r in rebalance], extra=extra)


def iter_lines(path: Path) -> Iterator[dict]:
    with open(path, "r", encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise HistoryError(f"history line {n}: not JSON ({exc.msg})") from None


def load(path: Path | str) -> History:
    path = Path(path)
    try:
        return build(iter_lines(path))
    except OSError as exc:
        raise HistoryError(f"cannot read history {path}: {exc.strerror}") from None


def from_events(events: Iterable[dict]) -> History:
    """For hand-made histories: events may omit index/time; they get defaults."""
    return build([dict(e) for e in events])


class HistoryWriter:
    """Appends events as JSON lines, flushing each so a crash leaves a usable prefix."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fh = open(self.path, "w", encoding="utf-8")
        self.count = 0

    def write(self, event: dict) -> dict:
        event = dict(event, index=self.count)
        self._fh.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._fh.flush()
        self.count += 1
        return event

    def close(self) -> None:
        self._fh.close()

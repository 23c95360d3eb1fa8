"""A small builder for hand-made histories: each test states its story in a few lines."""
from __future__ import annotations


class H:
    def __init__(self):
        self.events: list[dict] = []
        self.t = 0

    def _now(self, at: int | None) -> int:
        if at is None:
            self.t += 10
            return self.t
        self.t = max(self.t, at)
        return at

    # -- raw halves, for concurrent ops
    def invoke(self, p, f, value=None, at=None, **extra):
        self.events.append(dict(process=p, type="invoke", f=f, value=value, time=self._now(at), **extra))

    def complete(self, p, f, value=None, type="ok", at=None, **extra):
        self.events.append(dict(process=p, type=type, f=f, value=value, time=self._now(at), **extra))

    # -- whole ops
    @staticmethod
    def _mops(sends=(), reads=None, poll_first=False, invoked=False):
        sm = [["send", k, v] if invoked else ["send", k, [o, v]] for k, v, o in sends]
        if reads is None:
            return sm
        pm = [["poll"]] if invoked else [["poll", {str(k): [[o, v] for o, v in rs] for k, rs in reads.items()}]]
        return pm + sm if poll_first else sm + pm

    def txn_begin(self, p, sends=(), reads=None, at=None, **extra):
        self.invoke(p, "txn", self._mops(sends, reads, invoked=True), at=at, **extra)

    def txn_end(self, p, sends=(), reads=None, type="ok", at=None, poll_first=True,
                iso="read_committed", **extra):
        self.complete(p, "txn", self._mops(sends, reads, poll_first), type=type, at=at, isolation=iso, **extra)

    def txn(self, p, sends=(), reads=None, type="ok", iso="read_committed", poll_first=True, **extra):
        self.txn_begin(p, sends, reads, **{k: v for k, v in extra.items() if k == "txn_id"})
        self.txn_end(p, sends, reads, type=type, iso=iso, poll_first=poll_first, **extra)

    def poll(self, p, reads, iso="read_committed", rebalance=None, type="ok"):
        self.invoke(p, "poll", [["poll"]], isolation=iso)
        extra = {"rebalance": rebalance} if rebalance else {}
        self.complete(p, "poll", self._mops((), reads), type=type, isolation=iso, **extra)

    def assign(self, p, keys):
        self.invoke(p, "assign", list(keys))
        self.complete(p, "assign", list(keys))

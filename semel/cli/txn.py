"""`semel txn stats|list|describe|find-hanging|abort`: transactions seen by an operator.

Everything goes over the wire with Kafka's own admin APIs (ListTransactions,
DescribeTransactions, DescribeProducers, WriteTxnMarkers; KIP-664), so the
commands work against any broker that serves them. `stats` reads the
coordinator's counters from the broker's Prometheus endpoint.

A transaction hangs when a partition holds transactional data that nothing will
end: no live transaction at the coordinator includes that producer and partition
(its coordinator state was lost), or the coordinator's transaction is open far
past its timeout (the coordinator cannot complete it). Either way the partition's
last stable offset stays behind and read_committed consumers stop there.
"""
from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from ..client import admin
from ..protocol.errors import KafkaError
from .main import CliError
from .route import TRANSACTION, Route
from .wire import add_bootstrap, run_action

# Coordinator states whose transaction still owns its partitions (markers written or to come).
LIVE_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")
# Seed 000's stats, in its order: label -> Prometheus sample name.
STATS = [("Started", "semel_transactions_started_total"),
         ("Committed", "semel_transactions_committed_total"),
         ("Aborted", "semel_transactions_aborted_total"),
         ("Timed out", "semel_transactions_timed_out_total"),
         ("Active", "semel_transactions_active")]


def add_parser(sub) -> None:
    p = sub.add_parser("txn", help="inspect transactions, find hanging ones and abort them")
    tsub = p.add_subparsers(dest="action", metavar="ACTION")
    tsub.required = True
    st = tsub.add_parser("stats", help="the transaction coordinator's counters")
    st.add_argument("--metrics", default=None, metavar="HOST:PORT",
                    help="the broker's Prometheus endpoint (--metrics-port); without it only the "
                         "active count is shown (from ListTransactions)")
    ls = tsub.add_parser("list", help="transactional ids and their states")
    ls.add_argument("--state", action="append", default=[],
                    help="only these states (Kafka's names: Ongoing, CompleteCommit, ...; repeatable)")
    ls.add_argument("--producer-id", action="append", type=int, default=[], help="only these producer ids")
    d = tsub.add_parser("describe", help="one transactional id: state, producer, partitions")
    d.add_argument("transactional_id")
    fh = tsub.add_parser("find-hanging", help="partitions whose open transaction nothing will end")
    fh.add_argument("--topic", action="append", default=[], help="only these topics (default: all)")
    fh.add_argument("--grace-ms", type=int, default=60_000,
                    help="how far past its timeout a coordinator transaction must be to count (default 60000)")
    ab = tsub.add_parser("abort", help="abort a hanging transaction so read_committed readers move on")
    ab.add_argument("--topic", help="partition form: write an ABORT marker (Kafka's admin abort)")
    ab.add_argument("--partition", type=int)
    which = ab.add_mutually_exclusive_group()
    which.add_argument("--producer-id", type=int, help="the producer whose open transaction to abort")
    which.add_argument("--start-offset", type=int, help="the open transaction starting at this offset")
    ab.add_argument("--transactional-id",
                    help="coordinator form: fence this id (InitProducerId), aborting its open transaction")
    add_bootstrap((st, ls, d, fh, ab), run)


def run(args) -> int:
    return run_action(args, _ACTIONS)


# --- stats -----------------------------------------------------------------------------------

def _stats(route: Route, args) -> int:
    if args.metrics is None:
        active = _listed(route, states=["Ongoing", "PrepareCommit", "PrepareAbort"])
        print(f"Active: {len(active)}")
        print("(started/committed/aborted/timed-out counters: pass --metrics HOST:PORT of the broker's "
              "Prometheus endpoint)")
        return 0
    samples = scrape(args.metrics)
    for label, name in STATS:
        print(f"{label}: {int(samples.get(name, 0))}")
    return 0


def scrape(endpoint: str) -> dict[str, float]:
    """{sample name: value} of the unlabelled samples at a Prometheus endpoint."""
    from prometheus_client.parser import text_string_to_metric_families
    url = endpoint if "://" in endpoint else f"http://{endpoint}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise CliError(f"cannot read metrics from {url}: {getattr(exc, 'reason', exc)}") from None
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if not s.labels}


# --- list / describe ---------------------------------------------------------------------------

def _listed(route: Route, states: list[str], producer_ids: list[int] | None = None) -> list[admin.TxnListing]:
    """Every broker lists the transactional ids it coordinates (ListTransactions)."""
    rows = {r.transactional_id: r for c in route.every_broker()
            for r in admin.list_transactions(c, states=states, producer_ids=producer_ids)}
    return [rows[t] for t in sorted(rows)]


def _list(route: Route, args) -> int:
    rows = _listed(route, args.state, args.producer_id)
    print("transactional-id\tproducer-id\tstate")
    for r in rows:
        print(f"{r.transactional_id}\t{r.producer_id}\t{r.state}")
    return 0


def _describe(route: Route, args) -> int:
    (d,) = admin.describe_transactions(route.coordinator(args.transactional_id, TRANSACTION),
                                       [args.transactional_id])
    if d.error == KafkaError.TRANSACTIONAL_ID_NOT_FOUND:
        raise CliError(f"no transactional id {args.transactional_id!r} at the coordinator")
    if d.error:
        raise CliError(f"describe {args.transactional_id}: {d.error.name}")
    print(f"transactional-id: {d.transactional_id}")
    print(f"state: {d.state}")
    print(f"producer: id {d.producer_id} epoch {d.producer_epoch}")
    print(f"timeout-ms: {d.timeout_ms}")
    if d.start_time_ms >= 0:
        print(f"started: {_ago(d.start_time_ms)}")
    print("partitions: " + (", ".join(f"{t}-{p}" for t, p in d.partitions) or "-"))
    return 0


# --- find-hanging ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hanging:
    topic: str
    partition: int
    producer: admin.ProducerInfo | None
    transactional_id: str | None
    reason: str


def find_hanging(route: Route, topics: list[str] | None = None, grace_ms: int = 60_000) -> list[Hanging]:
    """Open transactions in partitions that nothing will end (see the module docstring):
    the partitions' producers from their leaders, the live transactions from their
    coordinators."""
    partitions = _partitions(route.boot, topics)
    # Coordinators before and after the partitions: a transaction that began or ended
    # while we looked is live in one of the two, so it is not taken for a hanging one.
    # (The view is still not atomic; the broker re-checks atomically before an abort.)
    live = _live(route)
    producers = {tp: rows for c, tps in route.by_leader(partitions)
                 for tp, rows in admin.describe_producers(c, tps).items()}
    live += _live(route)
    now = int(time.time() * 1000)
    found: list[Hanging] = []
    for (topic, partition), rows in sorted(producers.items()):
        for p in rows:
            if p.txn_start_offset < 0:
                continue
            owner = next((d for d in live if d.producer_id == p.producer_id and (topic, partition) in d.partitions),
                         None)
            if owner is None:
                found.append(Hanging(topic, partition, p, None,
                                     "no live transaction at the coordinator for this producer and partition"))
            elif _overdue(owner, now, grace_ms):
                found.append(Hanging(topic, partition, p, owner.transactional_id, _overdue_text(owner, now)))
    # Coordinator transactions far past their timeout that hold no data partition in view.
    shown = {h.transactional_id for h in found}
    for d in live:
        if d.transactional_id not in shown and _overdue(d, now, grace_ms):
            shown.add(d.transactional_id)
            found.append(Hanging("-", -1, None, d.transactional_id, _overdue_text(d, now)))
    return found


def _live(route: Route) -> list[admin.TxnDescription]:
    ids = [t.transactional_id for t in _listed(route, list(LIVE_STATES))]
    return [d for c, some in route.by_coordinator(ids, TRANSACTION) for d in admin.describe_transactions(c, some)
            if d.error == KafkaError.NONE and d.state in LIVE_STATES]


def _overdue(d: admin.TxnDescription, now: int, grace_ms: int) -> bool:
    return d.start_time_ms >= 0 and now - d.start_time_ms > d.timeout_ms + grace_ms


def _overdue_text(d: admin.TxnDescription, now: int) -> str:
    return f"{d.state} for {(now - d.start_time_ms) // 1000} s, past its {d.timeout_ms} ms timeout"


def _partitions(client, topics: list[str] | None) -> list[tuple[str, int]]:
    md = client.metadata(topics or None)
    out = []
    for t in md.topics:
        if t.error_code:
            raise CliError(f"topic {t.name}: {KafkaError(t.error_code).name}")
        if not t.is_internal and not t.name.startswith("__"):
            out += [(t.name, p.partition_index) for p in t.partitions]
    return sorted(out)


def _find_hanging(route: Route, args) -> int:
    found = find_hanging(route, args.topic, args.grace_ms)
    if not found:
        print("no hanging transactions")
        return 0
    print("topic\tpartition\tproducer-id\tepoch\tcoordinator-epoch\tstart-offset\ttransactional-id\treason")
    for h in found:
        p = h.producer
        cols = [h.topic, str(h.partition)] + (
            [str(p.producer_id), str(p.producer_epoch), str(p.coordinator_epoch), str(p.txn_start_offset)]
            if p else ["-"] * 4) + [h.transactional_id or "-", h.reason]
        print("\t".join(cols))
    return 0


# --- abort -------------------------------------------------------------------------------------

def _abort(route: Route, args) -> int:
    if args.transactional_id is not None:
        if args.topic is not None:
            raise CliError("give either --transactional-id or --topic/--partition, not both")
        return _abort_by_id(route.coordinator(args.transactional_id, TRANSACTION), args.transactional_id)
    if args.topic is None or args.partition is None:
        raise CliError("abort needs --topic and --partition (with --producer-id or --start-offset), "
                       "or --transactional-id")
    if args.producer_id is None and args.start_offset is None:
        raise CliError("abort needs --producer-id or --start-offset to say which transaction")
    tp = (args.topic, args.partition)
    client = route.leader(*tp)   # the marker goes where the data is, as Kafka's admin abort sends it
    rows = admin.describe_producers(client, [tp]).get(tp, [])
    target = next((p for p in rows if p.txn_start_offset >= 0 and
                   (p.producer_id == args.producer_id or p.txn_start_offset == args.start_offset)), None)
    if target is None:
        what = (f"of producer {args.producer_id}" if args.producer_id is not None
                else f"starting at offset {args.start_offset}")
        raise CliError(f"{args.topic}-{args.partition} has no open transaction {what}")
    err = admin.abort_partition(client, args.topic, args.partition, target.producer_id, target.producer_epoch,
                                target.coordinator_epoch)
    if err == KafkaError.CONCURRENT_TRANSACTIONS:
        raise CliError(f"the coordinator still owns producer {target.producer_id}'s transaction in "
                       f"{args.topic}-{args.partition}: abort it with --transactional-id (fences that producer)")
    if err:
        raise CliError(f"abort in {args.topic}-{args.partition}: {err.name}")
    print(f"aborted producer {target.producer_id}'s transaction in {args.topic}-{args.partition} "
          f"(started at offset {target.txn_start_offset})")
    return 0


def _abort_by_id(client, txn_id: str) -> int:
    (d,) = admin.describe_transactions(client, [txn_id])
    if d.error == KafkaError.TRANSACTIONAL_ID_NOT_FOUND:
        raise CliError(f"no transactional id {txn_id!r} at the coordinator")
    err, pid, epoch = admin.fence_until_settled(client, txn_id, d.timeout_ms or 60_000)
    if err == KafkaError.CONCURRENT_TRANSACTIONS:
        raise CliError(f"fence {txn_id}: the coordinator is still completing its transaction (it cannot write "
                       f"the markers; the broker log says why); try again once that is fixed")
    if err:
        raise CliError(f"fence {txn_id}: {err.name}")
    was = {"Ongoing": "its open transaction was aborted",
           "PrepareAbort": "its transaction was already aborting and is aborted",
           "PrepareCommit": "its transaction was already committing (a logged decision) and is committed",
           }.get(d.state, "it had no open transaction")
    print(f"fenced {txn_id}: {was}; producer id {pid} epoch {epoch} now belongs to no one")
    return 0


def _ago(ms: int) -> str:
    return f"{max(0, int(time.time() * 1000) - ms) // 1000} s ago"


_ACTIONS = {"stats": _stats, "list": _list, "describe": _describe, "find-hanging": _find_hanging,
            "abort": _abort}

"""The client's cluster router: connections to the brokers of one Kafka-compatible
cluster, found from the bootstrap list, with each partition's leader and each group's
and transactional id's coordinator cached and dropped again when an answer says it
moved (as a Kafka producer and consumer route), and the metadata, offset and fetch
requests the Spark source and sink make through them.

Every request is retried on retriable errors and on connection failures until
the caller's deadline, then fails with one readable ReaderError: a broker that
is gone fails the query, it never hangs it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ..backoff import Backoff
from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from ..protocol.messages import request_class
from .client import Client, ClientError, TlsError
from .security import PLAINTEXT, Security, SecurityError

EARLIEST = -2
LATEST = -1
READ_UNCOMMITTED = 0
READ_COMMITTED = 1

TP = tuple[str, int]

GROUP = 0        # FindCoordinator key types
TRANSACTION = 1

# Errors that say a cached coordinator or leader is no longer the one to ask.
COORDINATOR_MOVED = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                               KafkaError.COORDINATOR_LOAD_IN_PROGRESS})
MAX_CACHED_COORDINATORS = 10_000
LEADER_MOVED = frozenset({KafkaError.NOT_LEADER_OR_FOLLOWER, KafkaError.FENCED_LEADER_EPOCH,
                          KafkaError.UNKNOWN_TOPIC_OR_PARTITION})


class ReaderError(ClientError):
    """A read that cannot succeed (or did not within its deadline); one readable line."""


@dataclass
class Retry:
    """Bounded retries: exponential backoff until a deadline (and, when `attempts` is
    set, at most that many tries: Spark's fetchOffset.numRetries + 1)."""
    timeout_s: float
    backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    attempts: int | None = None

    def run(self, what: str, op: Callable[[], object]):
        pace = Backoff(self.timeout_s, first_s=self.backoff_s, max_s=self.max_backoff_s)
        tries = 0
        while True:
            try:
                return op()
            except _Transient as exc:
                last = exc
            tries += 1
            if self.attempts is not None and tries >= self.attempts:
                raise ReaderError(f"{what}: gave up after {tries} tries: {last}", getattr(last, "error", None))
            if not pace.fits():
                raise ReaderError(f"{what}: gave up after {self.timeout_s:g} s: {last}",
                                  getattr(last, "error", None))
            pace.wait()


class _Transient(ClientError):
    """Worth another try: a retriable Kafka error or a lost connection."""


def _check(code: int, what: str) -> None:
    err = KafkaError(code)
    if err is KafkaError.NONE:
        return
    if err.retriable:
        raise _Transient(f"{what}: {err.name}", err)
    raise ReaderError(f"{what}: {err.name}", err)


class ClusterRouter:
    """Connections to the brokers of one cluster, found from the bootstrap list."""

    def __init__(self, bootstrap: str, timeout_s: float = 30.0, client_id: str = "semel-spark",
                 topics: list[str] | None = None, fail_fast: bool = False, retry: Retry | None = None,
                 security: Security = PLAINTEXT):
        """topics: those whose metadata to load now (None: all); an executor reading one
        range needs one topic, not the metadata of a whole cluster. fail_fast: no retry
        of that first load (a writer refuses to start at once when no broker answers).
        retry: how requests are retried (default: for timeout_s).
        security: TLS and SASL for every connection (semel.client.security)."""
        self.bootstrap = [s.strip() for s in bootstrap.split(",") if s.strip()]
        self.client_id = client_id
        self.security = security
        self.retry = retry or Retry(timeout_s)
        self._socket_timeout = max(1.0, min(timeout_s, 30.0))
        self._conns: dict[str, Client] = {}
        self._zero_wait = True   # whether Fetch with max_wait_ms=0 is answered properly
        self.brokers: dict[int, str] = {}
        self.leaders: dict[TP, int] = {}
        self.topic_partitions: dict[str, int] = {}
        self.topic_errors: dict[str, KafkaError] = {}
        self.coordinators: dict[tuple[int, str], str] = {}   # (key type, key) -> address
        if not fail_fast:
            self.retry.run(f"connecting to {bootstrap}", lambda: self._refresh(topics))
            return
        try:
            self._refresh(topics)
        except _Transient as exc:
            self.close()
            raise ReaderError(str(exc), exc.error) from None

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()

    def drop_closed(self) -> None:
        """Forget connections the brokers have closed (kept idle between uses, e.g. by a
        Spark worker between tasks); they are reopened when next needed."""
        for address, c in list(self._conns.items()):
            if not c.idle_open():
                c.close()
                del self._conns[address]

    def __enter__(self) -> "ClusterRouter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- connections ------------------------------------------------------------

    def _conn(self, address: str) -> Client:
        c = self._conns.get(address)
        if c is None:
            try:
                c = self.security.connect(address, self.client_id, self._socket_timeout)
            except ClientError as exc:
                if isinstance(exc, TlsError) or (exc.error is not None and not exc.error.retriable):
                    # a refused login or certificate: retrying cannot help
                    raise ReaderError(str(exc), exc.error) from None
                raise _Transient(str(exc)) from None
            except SecurityError as exc:   # e.g. a trust store this process cannot read
                raise ReaderError(str(exc)) from None
            self._conns[address] = c
        return c

    def _call(self, address: str, api_key: int, **fields):
        c = self._conn(address)
        try:
            return c.request(api_key, **fields)
        except (ClientError, OSError) as exc:
            # A broken connection is dropped and reopened on the next try.
            self._conns.pop(address, None)
            c.close()
            if isinstance(exc, ClientError) and exc.error is None and "does not support" in str(exc):
                raise ReaderError(str(exc)) from None
            raise _Transient(f"{address}: {exc}") from None

    def _any_broker(self) -> str:
        why = ""
        for address in list(self._conns) + self.bootstrap + list(self.brokers.values()):
            try:
                self._conn(address)
                return address
            except _Transient as exc:
                why = f": {exc}"
        raise _Transient(f"no broker reachable (bootstrap {','.join(self.bootstrap)}){why}")

    # --- metadata ---------------------------------------------------------------

    def _refresh(self, topics: list[str] | None = None) -> None:
        cls = request_class(ApiKey.METADATA)
        req = None if topics is None else [cls.MetadataRequestTopic(name=t) for t in topics]
        md = self._call(self._any_broker(), ApiKey.METADATA, topics=req, allow_auto_topic_creation=False)
        self.brokers = {b.node_id: f"{b.host}:{b.port}" for b in md.brokers}
        for t in md.topics:
            if t.error_code:
                self.topic_partitions.pop(t.name, None)
                self.topic_errors[t.name] = KafkaError(t.error_code)
                continue
            self.topic_errors.pop(t.name, None)
            if t.name.startswith("__"):
                continue  # internal topics are never a source
            self.topic_partitions[t.name] = len(t.partitions)
            for p in t.partitions:
                self.leaders[(t.name, p.partition_index)] = p.leader_id

    def refresh(self) -> dict[str, int]:
        """All topics and their partition counts, fresh from the cluster."""
        self.topic_partitions = {}
        self.retry.run("metadata", self._refresh)
        return dict(self.topic_partitions)

    def topic_errors_of(self, topics: list[str]) -> dict[str, KafkaError]:
        """Why each of `topics` is missing from a listing: a Metadata request naming them
        (a listing leaves out topics the user may not Describe; naming one answers
        TOPIC_AUTHORIZATION_FAILED)."""
        self.retry.run("metadata", lambda: self._refresh(list(topics)))
        return {t: self.topic_errors[t] for t in topics if t in self.topic_errors}

    def _leader(self, tp: TP) -> str:
        node = self.leaders.get(tp)
        if node is None or node < 0 or node not in self.brokers:
            self._refresh([tp[0]])
            node = self.leaders.get(tp)
            if node is None or node not in self.brokers:
                raise _Transient(f"{tp[0]}-{tp[1]}: no leader known", KafkaError.LEADER_NOT_AVAILABLE)
        return self.brokers[node]

    def _by_leader(self, tps: Iterable[TP]) -> dict[str, list[TP]]:
        out: dict[str, list[TP]] = {}
        for tp in tps:
            out.setdefault(self._leader(tp), []).append(tp)
        return out

    # --- routing: coordinators and leaders, for writers (semel.spark.sink) ---------

    def _coordinator(self, key: str, key_type: int) -> str:
        """The address of `key`'s coordinator, asked once and cached until seen() drops it."""
        address = self.coordinators.get((key_type, key))
        if address is None:
            if len(self.coordinators) >= MAX_CACHED_COORDINATORS:
                self.coordinators.clear()   # a long-lived writer asks for many ids (one per branch)
            fc = self._call(self._any_broker(), ApiKey.FIND_COORDINATOR, key=key, key_type=key_type)
            _check(fc.error_code, f"FindCoordinator {key}")
            address = self.coordinators[(key_type, key)] = f"{fc.host}:{fc.port}"
        return address

    def coordinator(self, key: str, key_type: int) -> Client:
        """A connection to `key`'s coordinator (key_type GROUP or TRANSACTION); a cached
        coordinator that cannot be reached is forgotten and asked for again."""
        def attempt():
            address = self._coordinator(key, key_type)
            try:
                return self._conn(address)
            except _Transient:
                self.coordinators.pop((key_type, key), None)
                raise
        return self.retry.run(f"FindCoordinator {key}", attempt)

    def leader(self, tp: TP) -> Client:
        """A connection to the leader of `tp` (from Metadata, cached until seen() drops it)."""
        def attempt():
            address = self._leader(tp)
            try:
                return self._conn(address)
            except _Transient:
                self.leaders.pop(tp, None)
                raise
        return self.retry.run(f"the leader of {tp[0]}-{tp[1]}", attempt)

    def seen(self, err: KafkaError | None, *, coordinator: tuple[str, int] | None = None,
             tp: TP | None = None, address: str | None = None) -> KafkaError | None:
        """An answer's error: drops the cache entry it says is stale (a coordinator that
        moved, a leader that moved, or, err None, a broken connection to `address`: every
        entry naming it). Returns err, so that callers can pass it on."""
        if err is None and address is not None:
            self._forget_address(address)
        if coordinator is not None and (err is None or err in COORDINATOR_MOVED):
            self.coordinators.pop((coordinator[1], coordinator[0]), None)
        if tp is not None and (err is None or err in LEADER_MOVED):
            self.leaders.pop(tp, None)
        return err

    def broken(self, c: Client) -> None:
        """A connection that failed mid-request: closed, and nothing routed to it is kept."""
        for address, conn in list(self._conns.items()):
            if conn is c:
                self._forget_address(address)
        c.close()

    def _forget_address(self, address: str) -> None:
        c = self._conns.pop(address, None)
        if c is not None:
            c.close()
        self.coordinators = {k: a for k, a in self.coordinators.items() if a != address}
        self.leaders = {tp: n for tp, n in self.leaders.items() if self.brokers.get(n) != address}

    def partition_count(self, topic: str) -> int:
        """`topic`'s partition count (Metadata); ReaderError naming the broker's refusal."""
        if topic not in self.topic_partitions:
            self.retry.run(f"metadata of {topic}", lambda: self._refresh([topic]))
        n = self.topic_partitions.get(topic)
        if n is None:
            err = self.topic_errors.get(topic, KafkaError.UNKNOWN_TOPIC_OR_PARTITION)
            raise ReaderError(f"topic {topic}: {err.name}", err)
        return n

    # --- offsets ----------------------------------------------------------------

    def list_offsets(self, tps: Iterable[TP], spec: int, read_committed: bool) -> dict[TP, int]:
        """EARLIEST (log start) or LATEST (the LSO under read_committed, else the high watermark)."""
        want = sorted(set(tps))
        got: dict[TP, int] = {}

        def attempt():
            cls = request_class(ApiKey.LIST_OFFSETS)
            T = cls.ListOffsetsTopic
            try:
                for address, group in self._by_leader([tp for tp in want if tp not in got]).items():
                    topics: dict[str, list[int]] = {}
                    for t, p in group:
                        topics.setdefault(t, []).append(p)
                    resp = self._call(address, ApiKey.LIST_OFFSETS, replica_id=-1,
                                      isolation_level=READ_COMMITTED if read_committed else READ_UNCOMMITTED,
                                      topics=[T(name=t, partitions=[T.ListOffsetsPartition(
                                          partition_index=p, current_leader_epoch=-1, timestamp=spec)
                                          for p in ps]) for t, ps in topics.items()])
                    for rt in resp.topics:
                        for rp in rt.partitions:
                            _check(rp.error_code, f"ListOffsets {rt.name}-{rp.partition_index}")
                            got[(rt.name, rp.partition_index)] = rp.offset
            except _Transient:
                self.leaders.clear()  # leadership may have moved
                raise
            return got

        return self.retry.run("ListOffsets", attempt)

    def committed(self, group: str, tps: Iterable[TP]) -> dict[TP, int]:
        """The group's committed offsets (-1 where it has none), stable ones only."""
        want = sorted(set(tps))
        topics: dict[str, list[int]] = {}
        for t, p in want:
            topics.setdefault(t, []).append(p)

        def attempt():
            address = self._coordinator(group, GROUP)
            cls = request_class(ApiKey.OFFSET_FETCH)
            try:
                resp = self._call(address, ApiKey.OFFSET_FETCH, group_id=group, require_stable=True,
                                  topics=[cls.OffsetFetchRequestTopic(name=t, partition_indexes=ps)
                                          for t, ps in topics.items()])
                _check(resp.error_code, f"OffsetFetch {group}")
            except _Transient as exc:
                self.seen(exc.error, coordinator=(group, GROUP), address=address)
                raise
            out = {}
            for rt in resp.topics:
                for rp in rt.partitions:
                    _check(rp.error_code, f"OffsetFetch {group} {rt.name}-{rp.partition_index}")
                    out[(rt.name, rp.partition_index)] = rp.committed_offset
            return out

        return self.retry.run("OffsetFetch", attempt)

    # --- fetch ------------------------------------------------------------------

    def _fetch(self, address: str, positions: dict[TP, int], read_committed: bool, max_bytes: int,
               min_bytes: int = 1, max_wait_ms: int = 100) -> dict[TP, Any]:
        """One Fetch of several partitions led by one broker; partition responses by tp.
        Reads wait up to 100 ms, never 0: Tansu 0.6 answers a zero wait with no
        partitions at all (then a zero wait is not used again on this cluster)."""
        cls = request_class(ApiKey.FETCH)
        T = cls.FetchTopic
        topics: dict[str, list[int]] = {}
        for t, p in positions:
            topics.setdefault(t, []).append(p)
        resp = self._call(address, ApiKey.FETCH, replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                          max_bytes=max_bytes * len(positions),
                          isolation_level=READ_COMMITTED if read_committed else READ_UNCOMMITTED,
                          session_id=0, session_epoch=-1, topics=[T(topic=t, partitions=[
                              T.FetchPartition(partition=p, current_leader_epoch=-1,
                                               fetch_offset=positions[(t, p)], last_fetched_epoch=-1,
                                               log_start_offset=-1, partition_max_bytes=max_bytes)
                              for p in ps]) for t, ps in topics.items()],
                          forgotten_topics_data=[], rack_id="")
        _check(resp.error_code, "Fetch")
        out = {(rt.topic, rp.partition_index): rp for rt in resp.responses for rp in rt.partitions}
        missing = set(positions) - set(out)
        if missing:
            if max_wait_ms == 0:
                self._zero_wait = False
            raise _Transient(f"Fetch: no answer for {sorted(missing)}")
        return out

    def fetch(self, tp: TP, offset: int, read_committed: bool, max_bytes: int):
        """One Fetch of one partition from its leader; returns the partition response."""
        def attempt():
            try:
                p = self._fetch(self._leader(tp), {tp: offset}, read_committed, max_bytes)[tp]
                if p.error_code != KafkaError.OFFSET_OUT_OF_RANGE:
                    _check(p.error_code, f"Fetch {tp[0]}-{tp[1]} at {offset}")
                return p
            except _Transient:
                self.leaders.pop(tp, None)
                raise

        return self.retry.run(f"Fetch {tp[0]}-{tp[1]}", attempt)

    def latest(self, tps: Iterable[TP], read_committed: bool) -> dict[TP, int]:
        """The end a reader may read up to: the LSO under read_committed, else the high
        watermark. ListOffsets answers it; the marks a Fetch reports at that offset
        confirm it (Tansu 0.6 answers ListOffsets latest with the last batch's base
        offset + 1, which would hide the rest of that batch)."""
        listed = self.list_offsets(tps, LATEST, read_committed)

        def attempt():
            out = dict(listed)
            try:
                for address, group in self._by_leader(listed).items():
                    # Zero wait where the broker allows it: semel waits max_wait_ms
                    # even for min_bytes=0 at the log end.
                    got = self._fetch(address, {tp: listed[tp] for tp in group}, read_committed,
                                      max_bytes=1, min_bytes=0, max_wait_ms=0 if self._zero_wait else 100)
                    for tp, p in got.items():
                        if p.error_code == KafkaError.NONE:
                            mark = p.last_stable_offset if read_committed else p.high_watermark
                            if mark is not None and mark >= 0:
                                out[tp] = max(out[tp], mark)
            except _Transient:
                self.leaders.clear()
                raise
            return out

        return self.retry.run("Fetch (end offsets)", attempt)

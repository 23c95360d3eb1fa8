"""Options of `format("semel")`: names, parsing and validation, shared by the
source (source.py) and the exactly-once sink (sink.py).

Names follow Spark's own Kafka connector wherever it has one, so a query moves
over by changing `format("kafka")` to `format("semel")` and nothing else. Spark
hands options to a data source case-insensitively (its option map lower-cases
keys), so every lookup here goes through one lower-cased view. An option that
neither side knows is an error, never silently ignored: a misspelt
`startingOffset` must not turn into a read from `latest`.

The one name both sides must agree on is the consumer group under which the
sink commits the source offsets of each batch in the batch's transaction, and
from which the source reads them back for `startingOffsets=committed`:
`query_group_id(options)`.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Mapping

from . import security
from .security import Security, SecurityError


class OptionError(ValueError):
    """A malformed or unknown option: raised when the query starts, one readable line."""


# --- shared by source and sink -------------------------------------------------
# Every option name lives here, once; source.py and sink.py use these constants.

BOOTSTRAP = "kafka.bootstrap.servers"
# The consumer group that holds the offsets a query's committed batches recorded
# (Spark's Kafka source option of the same name). When absent it is derived from
# the checkpoint location, which the sink sees as `checkpointLocation`; a reader
# that wants `startingOffsets=committed` passes either the same group id or the
# same checkpoint location.
GROUP_ID = "kafka.group.id"
# Spark's prefix for the group ids it generates; here the prefix of the derived group.
GROUP_ID_PREFIX = "groupidprefix"
DEFAULT_GROUP_PREFIX = "semel-query"
CHECKPOINT = "checkpointlocation"
CLIENT_ID = "kafka.client.id"
# Bounded retries: how long the driver and the executors keep retrying a
# retriable broker error (or an unreachable broker) before failing the query.
REQUEST_TIMEOUT = "kafka.request.timeout.ms"
# Spark adds `path` for `.load(path)` / `.start(path)`; we do not use it but it
# is not the user's typo either.
_SPARK_ADDED = {"path"}

# kafka.security.protocol, kafka.sasl.*, kafka.ssl.*: semel/spark/security.py
SHARED_OPTIONS = {BOOTSTRAP, GROUP_ID, GROUP_ID_PREFIX, CHECKPOINT, CLIENT_ID, REQUEST_TIMEOUT} | security.OPTIONS

# --- source -------------------------------------------------------------------

SUBSCRIBE = "subscribe"
SUBSCRIBE_PATTERN = "subscribepattern"
ASSIGN = "assign"
STARTING = "startingoffsets"
ENDING = "endingoffsets"
STARTING_TS = "startingtimestamp"
STARTING_BY_TS = "startingoffsetsbytimestamp"
ENDING_TS = "endingtimestamp"
ENDING_BY_TS = "endingoffsetsbytimestamp"
TS_STRATEGY = "startingoffsetsbytimestampstrategy"
MAX_OFFSETS = "maxoffsetspertrigger"
MAX_RECORDS = "maxrecordspertrigger"     # a synonym of maxOffsetsPerTrigger
MIN_OFFSETS = "minoffsetspertrigger"
MAX_TRIGGER_DELAY = "maxtriggerdelay"
ISOLATION = "kafka.isolation.level"
FAIL_ON_DATA_LOSS = "failondataloss"
INCLUDE_HEADERS = "includeheaders"
MIN_PARTITIONS = "minpartitions"          # split ranges so that at least this many tasks read
MAX_PER_PARTITION = "maxrecordsperpartition"  # split ranges so that none is longer
FETCH_RETRIES = "fetchoffset.numretries"      # the driver's offset requests: tries ...
FETCH_RETRY_INTERVAL = "fetchoffset.retryintervalms"  # ... and the first wait between them
POLL_TIMEOUT = "kafkaconsumer.polltimeoutms"  # the executors' bound on reading a range
FETCH_MAX_BYTES = "kafka.max.partition.fetch.bytes"

SOURCE_OPTIONS = {SUBSCRIBE, SUBSCRIBE_PATTERN, ASSIGN, STARTING, ENDING, STARTING_TS, STARTING_BY_TS,
                  ENDING_TS, ENDING_BY_TS, TS_STRATEGY, MAX_OFFSETS, MAX_RECORDS, MIN_OFFSETS,
                  MAX_TRIGGER_DELAY, ISOLATION, FAIL_ON_DATA_LOSS, INCLUDE_HEADERS, MIN_PARTITIONS,
                  MAX_PER_PARTITION, FETCH_RETRIES, FETCH_RETRY_INTERVAL, POLL_TIMEOUT, FETCH_MAX_BYTES}

# --- sink (parsed by the sink: semel/spark/sink.py) ----------------------------

TOPIC = "topic"
QUERY_ID = "semel.query.id"               # query identity when there is no checkpoint/group id
RESTART_WINDOW = "semel.restartwindowms"  # branch transaction timeout = longest tolerated outage
ATOMIC = "semel.atomicbatches"            # auto | true | false (mode a: broker-side batch atomicity)
BATCH_ROWS = "semel.batch.rows"           # rows per produced record batch
# Producer settings of Spark's Kafka sink that keep the guarantee (parse_producer).
COMPRESSION = "kafka.compression.type"
LINGER = "kafka.linger.ms"
BATCH_SIZE = "kafka.batch.size"
ACKS = "kafka.acks"
IDEMPOTENCE = "kafka.enable.idempotence"

# write_each_batch (foreachBatch) only, where semel chooses the writing tasks: how many
# (default: the executors' cores) and whether a round-robin shuffle evens them out.
WRITE_TASKS = "semel.write.tasks"
WRITE_REBALANCE = "semel.write.rebalance"
EACH_BATCH_OPTIONS = {WRITE_TASKS, WRITE_REBALANCE}

SINK_OPTIONS = {TOPIC, QUERY_ID, RESTART_WINDOW, ATOMIC, BATCH_ROWS, COMPRESSION, LINGER, BATCH_SIZE,
                ACKS, IDEMPOTENCE} | EACH_BATCH_OPTIONS

# --- every option of Spark's Kafka connector ------------------------------------

SAME, MAPPED, REFUSED, SECURITY = "same", "mapped", "refused", "used, see Security"


@dataclass(frozen=True)
class SparkOption:
    """One option of Spark's own Kafka connector (Spark 4's Structured Streaming + Kafka
    Integration Guide) and what format("semel") does with it. docs/spark.md's migration
    table shows exactly these rows (tests/spark/test_options_table.py checks it)."""
    name: str    # Spark's spelling; `kafka.sasl.*` names a family
    side: str    # source | sink | both
    semel: str   # SAME | MAPPED | REFUSED | SECURITY
    note: str


SPARK_KAFKA_OPTIONS: tuple[SparkOption, ...] = (
    SparkOption("assign", "source", SAME, ""),
    SparkOption("subscribe", "source", SAME, "a topic that does not exist yet: a stream waits for it "
                "(with a warning), a batch read fails"),
    SparkOption("subscribePattern", "source", SAME, "Python `re`, matched against the whole topic name"),
    SparkOption("kafka.bootstrap.servers", "both", SAME, ""),
    SparkOption("startingTimestamp", "source", SAME, ""),
    SparkOption("startingOffsetsByTimestamp", "source", SAME, ""),
    SparkOption("startingOffsetsByTimestampStrategy", "source", SAME, "`error` or `latest`"),
    SparkOption("startingOffsets", "source", SAME, "also `committed`: where the query's own committed "
                "batches left off"),
    SparkOption("endingTimestamp", "source", SAME, "batch reads"),
    SparkOption("endingOffsetsByTimestamp", "source", SAME, "batch reads"),
    SparkOption("endingOffsets", "source", SAME, "batch reads"),
    SparkOption("failOnDataLoss", "source", SAME, ""),
    SparkOption("kafkaConsumer.pollTimeoutMs", "source", MAPPED, "how long a task retries reading its "
                "range before it fails (default: `kafka.request.timeout.ms`)"),
    SparkOption("fetchOffset.numRetries", "source", MAPPED, "the driver's offset requests are tried at "
                "most this many times more (default: retried for `kafka.request.timeout.ms`)"),
    SparkOption("fetchOffset.retryIntervalMs", "source", MAPPED, "the first wait between those tries, "
                "give or take 20% (random jitter); then doubling, each wait at most 1 s"),
    SparkOption("maxOffsetsPerTrigger", "source", SAME, ""),
    SparkOption("minOffsetsPerTrigger", "source", SAME, ""),
    SparkOption("maxTriggerDelay", "source", SAME, ""),
    SparkOption("minPartitions", "source", SAME, ""),
    SparkOption("maxRecordsPerPartition", "source", SAME, ""),
    SparkOption("groupIdPrefix", "both", MAPPED, "prefix of the group derived from `checkpointLocation` "
                "(default `semel-query`); semel reads without joining a consumer group"),
    SparkOption("kafka.group.id", "both", MAPPED, "the group holding the query's committed offsets, "
                "shared by source and sink; never joined as a consumer"),
    SparkOption("includeHeaders", "source", SAME, "the sink writes a `headers` column in any case"),
    SparkOption("topic", "sink", SAME, "overrides a `topic` column"),
    SparkOption("kafka.isolation.level", "source", MAPPED, "default `read_committed` (Spark's: "
                "`read_uncommitted`)"),
    SparkOption("kafka.request.timeout.ms", "both", MAPPED, "how long a broker request (or an "
                "unreachable broker) is retried before the query fails"),
    SparkOption("kafka.max.partition.fetch.bytes", "source", SAME, ""),
    SparkOption("kafka.client.id", "both", SAME, ""),
    SparkOption("kafka.compression.type", "sink", SAME, "`none`, `gzip`, `snappy`, `lz4`, `zstd`"),
    SparkOption("kafka.linger.ms", "sink", MAPPED, "how long a task lets its records wait for more "
                "before it sends them"),
    SparkOption("kafka.batch.size", "sink", SAME, "bytes of keys and values per record batch "
                "(at most 1 MB)"),
    SparkOption("kafka.acks", "sink", REFUSED, "unless `all` or `-1`: a batch is decided only on "
                "records every in-sync replica holds"),
    SparkOption("kafka.enable.idempotence", "sink", REFUSED, "when `false`: transactions need the "
                "idempotent producer"),
    SparkOption("kafka.transactional.id", "sink", REFUSED, "the sink names its own transactions "
                "(after the query's group)"),
    SparkOption("kafka.auto.offset.reset", "source", REFUSED, "as in Spark: use `startingOffsets`"),
    SparkOption("kafka.enable.auto.commit", "source", REFUSED, "as in Spark: the query's offsets are "
                "in its checkpoint (and committed by the sink)"),
    SparkOption("kafka.key.deserializer", "source", REFUSED, "as in Spark: keys are binary; cast them "
                "in the query"),
    SparkOption("kafka.value.deserializer", "source", REFUSED, "as in Spark: values are binary; cast "
                "them in the query"),
    SparkOption("kafka.key.serializer", "sink", REFUSED, "as in Spark: give a string or binary `key` "
                "column"),
    SparkOption("kafka.value.serializer", "sink", REFUSED, "as in Spark: give a string or binary "
                "`value` column"),
    SparkOption("kafka.interceptor.classes", "both", REFUSED, "as in Spark: no Java client runs"),
    SparkOption("kafka.security.protocol", "both", SECURITY, "`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`, "
                "`SASL_SSL`"),
    SparkOption("kafka.sasl.*", "both", SECURITY, "`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`, `OAUTHBEARER` "
                "(no `GSSAPI`)"),
    SparkOption("kafka.ssl.*", "both", SECURITY, "PEM stores only: JKS and PKCS12 are refused with the "
                "command that converts them"),
    SparkOption("kafka.*", "both", REFUSED, "any other Kafka client setting: an error naming it "
                "(Spark hands it to the Kafka client)"),
)

# Refused whatever their value, with the reason: option name -> why.
_REFUSED_NAMES = {o.name.lower(): o.note for o in SPARK_KAFKA_OPTIONS
                  if o.semel == REFUSED and "*" not in o.name and o.name.lower() not in (ACKS, IDEMPOTENCE)}

# ------------------------------------------------------------------------------

EARLIEST = -2
LATEST = -1

# Spark's spelling of the names, for messages (the lookups use the lower-case names).
_SPELLING = {ENDING: "endingOffsets", ENDING_TS: "endingTimestamp", ENDING_BY_TS: "endingOffsetsByTimestamp"}


def lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _check_known(opts: dict[str, str], known: set[str], side: str) -> None:
    for name in sorted(set(opts) & set(_REFUSED_NAMES)):
        raise OptionError(f"option '{name}' is refused by format('semel'): {_REFUSED_NAMES[name]}")
    unknown = sorted(set(opts) - known - SHARED_OPTIONS - _SPARK_ADDED)
    if unknown:
        raise OptionError(f"unknown {side} option(s) for format('semel'): {', '.join(unknown)}")


def parse_security(opts: dict[str, str]) -> Security:
    try:
        return security.parse(opts)
    except SecurityError as exc:
        raise OptionError(str(exc)) from None


def validate_sink(options: Mapping[str, str]) -> dict[str, str]:
    """Lower-cased options after checking every name is one the sink knows."""
    opts = lower(options)
    _check_known(opts, SINK_OPTIONS, "sink")
    _bootstrap(opts)
    return opts


def query_group_id(options: Mapping[str, str]) -> str | None:
    """The consumer group under which a query's batches commit their source offsets.

    `kafka.group.id` when given; otherwise derived from the checkpoint location
    (stable across restarts of the same query, different for different queries).
    None when neither is known."""
    opts = lower(options)
    if opts.get(GROUP_ID):
        return opts[GROUP_ID]
    loc = opts.get(CHECKPOINT)
    if not loc:
        return None
    digest = hashlib.sha256(loc.rstrip("/").encode()).hexdigest()[:16]
    return f"{opts.get(GROUP_ID_PREFIX) or DEFAULT_GROUP_PREFIX}-{digest}"


# --- producer settings of the sink ------------------------------------------------

# Kafka's compression.type names and their record-batch attribute codes.
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@dataclass(frozen=True)
class ProducerOptions:
    compression: int = 0
    linger_ms: int = 0
    batch_bytes: int | None = None  # None: as large as a request allows
    client_id: str = "semel-spark-sink"


@dataclass(frozen=True)
class WriteTasks:
    """How write_each_batch spreads a micro-batch over Python tasks."""
    tasks: int | None = None  # None: the executors' cores (SparkContext.defaultParallelism)
    rebalance: bool = False   # a round-robin shuffle to `tasks` partitions instead of a coalesce


def parse_write_tasks(options: Mapping[str, str]) -> WriteTasks:
    opts = lower(options)
    return WriteTasks(_positive_int(opts, WRITE_TASKS), _bool(opts, WRITE_REBALANCE, False))


def refuse_write_tasks(options: Mapping[str, str]) -> None:
    """format("semel") writes from one task per partition of its input (PySpark's
    choice): the options that choose the tasks are write_each_batch's alone."""
    for name in sorted(set(lower(options)) & EACH_BATCH_OPTIONS):
        raise OptionError(f"option '{name}' applies to foreachBatch(write_each_batch(...)) only: format('semel') "
                          "writes from one task per partition of its input (coalesce the DataFrame or lower "
                          "spark.sql.shuffle.partitions instead)")


def parse_producer(options: Mapping[str, str]) -> ProducerOptions:
    """The `kafka.*` producer settings the exactly-once sink honours; the two that
    would weaken the guarantee are refused with the reason."""
    opts = lower(options)
    acks = opts.get(ACKS, "all").strip().lower()
    if acks not in ("all", "-1"):
        raise OptionError(f"option '{ACKS}={opts[ACKS]}' is refused: the exactly-once sink decides a "
                          "batch only on records every in-sync replica holds (acks=all)")
    if not _bool(opts, IDEMPOTENCE, True):
        raise OptionError(f"option '{IDEMPOTENCE}=false' is refused: transactions need the idempotent "
                          "producer, and without it a resent batch could be written twice")
    codec = opts.get(COMPRESSION, "none").strip().lower()
    if codec not in CODECS:
        raise OptionError(f"option '{COMPRESSION}' must be one of {', '.join(CODECS)}, got {opts[COMPRESSION]!r}")
    return ProducerOptions(compression=CODECS[codec], linger_ms=_positive_int(opts, LINGER, allow_zero=True) or 0,
                           batch_bytes=_positive_int(opts, BATCH_SIZE),
                           client_id=opts.get(CLIENT_ID) or ProducerOptions.client_id)


# --- parsed source options -------------------------------------------------------

@dataclass(frozen=True)
class Subscription:
    """Exactly one of the three ways Spark's Kafka source names its input."""
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[tuple[str, int], ...] = ()

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assigned:
            return any(t == topic for t, _ in self.assigned)
        return topic in self.topics


@dataclass(frozen=True)
class ByTimestamp:
    """Start or end at the first offset whose record timestamp is at or after a time
    (ms): one for every partition (`every`), or per partition."""
    every: int | None = None
    per: dict = field(default_factory=dict)   # {topic: {partition: ms}}


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    subscription: Subscription
    # "earliest" | "latest" | "committed" | {topic: {partition: offset}} (-2/-1 allowed)
    starting: object = "latest"
    ending: object = "latest"
    max_offsets: int | None = None
    min_offsets: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    read_committed: bool = True
    fail_on_data_loss: bool = True
    include_headers: bool = False
    min_partitions: int | None = None
    group_id: str | None = None
    request_timeout_ms: int = 30_000
    fetch_max_bytes: int = 4 << 20
    security: Security = security.PLAINTEXT
    starting_strategy: str = "error"        # no offset at the starting timestamp: error | latest
    max_per_partition: int | None = None
    fetch_retries: int | None = None        # None: retried for request_timeout_ms
    fetch_retry_interval_ms: int | None = None
    poll_timeout_ms: int | None = None      # None: request_timeout_ms
    client_id: str = "semel-spark"
    # repr=False: it holds the options as given, secrets included
    raw: dict = field(default_factory=dict, compare=False, repr=False)


def _bootstrap(opts: dict[str, str]) -> str:
    servers = opts.get(BOOTSTRAP, "").strip()
    if not servers:
        raise OptionError(f"option '{BOOTSTRAP}' is required (HOST:PORT[,HOST:PORT...])")
    for s in servers.split(","):
        host, _, port = s.strip().rpartition(":")
        if not host or not port.isdigit():
            raise OptionError(f"option '{BOOTSTRAP}': expected HOST:PORT, got {s.strip()!r}")
    return servers


def _positive_int(opts: dict[str, str], name: str, *, allow_zero: bool = False) -> int | None:
    if name not in opts:
        return None
    try:
        v = int(opts[name])
    except ValueError:
        raise OptionError(f"option '{name}' must be an integer, got {opts[name]!r}") from None
    if v < 0 or (v == 0 and not allow_zero):
        raise OptionError(f"option '{name}' must be positive, got {v}")
    return v


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    if name not in opts:
        return default
    v = opts[name].strip().lower()
    if v not in ("true", "false"):
        raise OptionError(f"option '{name}' must be true or false, got {opts[name]!r}")
    return v == "true"


_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h)?\s*$")
_UNIT_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


def _duration_ms(opts: dict[str, str], name: str, default: int) -> int:
    if name not in opts:
        return default
    m = _DURATION.match(opts[name])
    if not m:
        raise OptionError(f"option '{name}' must be a duration like 500ms, 30s or 5m, got {opts[name]!r}")
    return int(m.group(1)) * _UNIT_MS[m.group(2)]


def _subscription(opts: dict[str, str]) -> Subscription:
    given = [n for n in (SUBSCRIBE, SUBSCRIBE_PATTERN, ASSIGN) if opts.get(n, "").strip()]
    if len(given) != 1:
        raise OptionError("exactly one of the options 'subscribe', 'subscribePattern', 'assign' "
                          f"is required, got {len(given)}")
    name, value = given[0], opts[given[0]].strip()
    if name == SUBSCRIBE:
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise OptionError("option 'subscribe' names no topic")
        return Subscription(topics=topics)
    if name == SUBSCRIBE_PATTERN:
        try:
            re.compile(value)
        except re.error as exc:
            raise OptionError(f"option 'subscribePattern' is not a valid regex: {exc}") from None
        return Subscription(pattern=value)
    parsed = _json(ASSIGN, value)
    pairs = []
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError("option 'assign' must be JSON like {\"topic\":[0,1]}")
    for topic, parts in parsed.items():
        if not isinstance(parts, list) or not all(isinstance(p, int) and p >= 0 for p in parts):
            raise OptionError(f"option 'assign': partitions of {topic!r} must be a list of integers >= 0")
        pairs.extend((topic, p) for p in parts)
    return Subscription(assigned=tuple(sorted(pairs)))


def _json(name: str, value: str):
    try:
        return json.loads(value)
    except ValueError as exc:
        raise OptionError(f"option '{name}' is not valid JSON: {exc}") from None


def _offsets(opts: dict[str, str], name: str, default: str, words: tuple[str, ...]) -> object:
    value = opts.get(name, default).strip()
    if value.lower() in words:
        return value.lower()
    if not value.startswith("{"):
        raise OptionError(f"option '{name}' must be one of {', '.join(words)} or per-partition JSON "
                          f"like {{\"topic\":{{\"0\":23,\"1\":-2}}}}, got {value!r}")
    parsed = _json(name, value)
    out: dict[str, dict[int, int]] = {}
    if not isinstance(parsed, dict):
        raise OptionError(f"option '{name}' must be a JSON object of topics")
    for topic, parts in parsed.items():
        if not isinstance(parts, dict):
            raise OptionError(f"option '{name}': {topic!r} must map partitions to offsets")
        out[topic] = {}
        for p, off in parts.items():
            if not str(p).isdigit() or not isinstance(off, int) or isinstance(off, bool) or off < -2:
                raise OptionError(f"option '{name}': {topic}[{p}] = {off!r} is not a partition "
                                  "number mapped to an offset >= -2 (-2 earliest, -1 latest)")
            out[topic][int(p)] = off
    return out


def _timestamp(opts: dict[str, str], name: str) -> int:
    try:
        v = int(opts[name])
    except ValueError:
        raise OptionError(f"option '{name}' must be a timestamp in ms since the epoch, got {opts[name]!r}") from None
    if v < 0:
        raise OptionError(f"option '{name}' must be a timestamp >= 0, got {v}")
    return v


def _by_timestamp(opts: dict[str, str], single: str, per: str):
    """Spark's precedence: a single timestamp over per-partition timestamps; None
    when neither is given (then the offsets option applies)."""
    if single in opts:
        return ByTimestamp(every=_timestamp(opts, single))
    if per not in opts:
        return None
    parsed = _json(per, opts[per])
    out: dict[str, dict[int, int]] = {}
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"option '{per}' must be JSON like {{\"topic\":{{\"0\":1700000000000}}}}")
    for topic, parts in parsed.items():
        if not isinstance(parts, dict):
            raise OptionError(f"option '{per}': {topic!r} must map partitions to timestamps")
        for p, ts in parts.items():
            if not str(p).isdigit() or not isinstance(ts, int) or isinstance(ts, bool) or ts < 0:
                raise OptionError(f"option '{per}': {topic}[{p}] = {ts!r} is not a partition number "
                                  "mapped to a timestamp in ms >= 0")
            out.setdefault(topic, {})[int(p)] = ts
    return ByTimestamp(per=out)


def parse_source(options: Mapping[str, str], *, batch: bool) -> SourceOptions:
    """Validate and parse the source options; raises OptionError with one readable line."""
    opts = lower(options)
    _check_known(opts, SOURCE_OPTIONS, "source")
    bootstrap = _bootstrap(opts)
    sub = _subscription(opts)
    starting = _offsets(opts, STARTING, "earliest" if batch else "latest",
                        ("earliest", "latest", "committed"))
    for name in (ENDING, ENDING_TS, ENDING_BY_TS):
        if name in opts and not batch:
            raise OptionError(f"option '{_SPELLING.get(name, name)}' is for batch reads (spark.read) only")
    ending = _offsets(opts, ENDING, "latest", ("latest",))
    if isinstance(ending, dict) and any(o == EARLIEST for ps in ending.values() for o in ps.values()):
        raise OptionError("option 'endingOffsets': -2 (earliest) is not allowed as an ending offset")
    if batch and starting == "latest":
        raise OptionError("option 'startingOffsets': 'latest' is not allowed for batch reads")
    if batch and isinstance(starting, dict) and any(
            o == LATEST for ps in starting.values() for o in ps.values()):
        raise OptionError("option 'startingOffsets': -1 (latest) is not allowed for batch reads")
    if MAX_OFFSETS in opts and MAX_RECORDS in opts and opts[MAX_OFFSETS] != opts[MAX_RECORDS]:
        raise OptionError("options 'maxOffsetsPerTrigger' and 'maxRecordsPerTrigger' disagree")
    max_offsets = _positive_int(opts, MAX_OFFSETS) or _positive_int(opts, MAX_RECORDS)
    min_offsets = _positive_int(opts, MIN_OFFSETS)
    if max_offsets is not None and min_offsets is not None and min_offsets > max_offsets:
        raise OptionError("option 'minOffsetsPerTrigger' is larger than 'maxOffsetsPerTrigger'")
    isolation = opts.get(ISOLATION, "read_committed").strip().lower()
    if isolation not in ("read_committed", "read_uncommitted"):
        raise OptionError(f"option '{ISOLATION}' must be read_committed or read_uncommitted, "
                          f"got {opts[ISOLATION]!r}")
    strategy = opts.get(TS_STRATEGY, "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(f"option 'startingOffsetsByTimestampStrategy' must be error or latest, "
                          f"got {opts[TS_STRATEGY]!r}")
    starting = _by_timestamp(opts, STARTING_TS, STARTING_BY_TS) or starting
    ending = _by_timestamp(opts, ENDING_TS, ENDING_BY_TS) or ending
    group = query_group_id(opts)
    if starting == "committed" and group is None:
        raise OptionError("startingOffsets=committed needs 'kafka.group.id' or 'checkpointLocation' "
                          "(the same as the sink's) to find the query's committed offsets")
    return SourceOptions(
        bootstrap=bootstrap, subscription=sub, starting=starting, ending=ending,
        max_offsets=max_offsets, min_offsets=min_offsets,
        max_trigger_delay_ms=_duration_ms(opts, MAX_TRIGGER_DELAY, 15 * 60 * 1000),
        read_committed=isolation == "read_committed",
        fail_on_data_loss=_bool(opts, FAIL_ON_DATA_LOSS, True),
        include_headers=_bool(opts, INCLUDE_HEADERS, False),
        min_partitions=_positive_int(opts, MIN_PARTITIONS),
        group_id=group,
        request_timeout_ms=_positive_int(opts, REQUEST_TIMEOUT) or 30_000,
        fetch_max_bytes=_positive_int(opts, FETCH_MAX_BYTES) or (4 << 20),
        security=parse_security(opts),
        starting_strategy=strategy,
        max_per_partition=_positive_int(opts, MAX_PER_PARTITION),
        fetch_retries=_positive_int(opts, FETCH_RETRIES, allow_zero=True),
        fetch_retry_interval_ms=_positive_int(opts, FETCH_RETRY_INTERVAL),
        poll_timeout_ms=_positive_int(opts, POLL_TIMEOUT),
        client_id=opts.get(CLIENT_ID) or SourceOptions.client_id,
        raw=opts)

"""The log manager: a durable topic catalogue and the partition logs it names.

The catalogue (one file, `topics.catalogue`) is the commit point of every topic
change; it is replaced atomically (tmp + fsync + rename + fsync of the directory)
and CRC-protected, so a crash leaves the old or the new catalogue:

- create: catalogue first, then the partition directories. A crash in between
  leaves a topic whose directories are created empty at the next start.
- delete: the topic is marked "deleting" (from then on it is gone for clients),
  its directories are removed, then its entry. A crash in between is finished at
  the next start.

Partition directories are `<data_dir>/<topic>-<partition>/`.
"""
from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from semel.protocol.errors import KafkaError

from . import checked_file, compaction
from .errors import StorageError
from .fs import FileSystem
from .log import LogConfig, PartitionLog

log = logging.getLogger("semel.storage")

CATALOGUE = "topics.catalogue"
# Present only between a clean close and the next open: its absence at open means the
# last run ended without one (a crash or a power cut), when unsynced writes may be gone.
CLEAN_STOP = ".clean-stop"
NEW, CLEAN, UNCLEAN = "new", "clean", "unclean"
_HEADER = "semel-catalogue 1 "
# Kafka's default delete.retention.ms: how long a compacted topic keeps a tombstone.
DEFAULT_DELETE_RETENTION_MS = 86_400_000
MAX_TOPIC_NAME = 249  # "<topic>-<partition>" must stay a legal file name
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")

LIVE, DELETING = "live", "deleting"


def _int_in(lo: int, hi: int = 2**63 - 1) -> Callable[[str], int]:
    def parse(v: str) -> int:
        n = int(v)
        if not lo <= n <= hi:
            raise ValueError(f"must be in [{lo}, {hi}]")
        return n
    return parse


def _cleanup_policy(v: str) -> str:
    parts = sorted(p.strip() for p in v.split(","))
    if not parts or any(p not in ("delete", "compact") for p in parts):
        raise ValueError("must be delete, compact or both")
    return ",".join(parts)


def _flush_mode(v: str) -> str:
    if v not in ("always", "interval", "never"):
        raise ValueError("must be always, interval or never")
    return v


# Topic configs that change how the log behaves: Kafka name -> (LogConfig field, parser).
LOG_CONFIG_KEYS: dict[str, tuple[str, Callable[[str], object]]] = {
    "segment.bytes": ("segment_bytes", _int_in(61, 2**31 - 1)),
    "index.interval.bytes": ("index_interval_bytes", _int_in(0)),
    "retention.bytes": ("retention_bytes", _int_in(-1)),
    "retention.ms": ("retention_ms", _int_in(-1)),
    "flush.ms": ("flush_interval_ms", _int_in(1)),
    "semel.flush.mode": ("flush_mode", _flush_mode),
}
# Topic configs that are accepted and kept (clients and tools set them) but act elsewhere or not at all.
OTHER_CONFIG_KEYS: dict[str, Callable[[str], object]] = {
    "cleanup.policy": _cleanup_policy,
    "max.message.bytes": _int_in(0),
    "min.insync.replicas": _int_in(1),
    "compression.type": str,
    "message.timestamp.type": str,
    "message.timestamp.difference.max.ms": _int_in(0),
    "message.timestamp.before.max.ms": _int_in(0),
    "message.timestamp.after.max.ms": _int_in(0),
    "unclean.leader.election.enable": str,
    "segment.ms": _int_in(1),
    "segment.jitter.ms": _int_in(0),
    "segment.index.bytes": _int_in(4),
    "flush.messages": _int_in(1),
    "delete.retention.ms": _int_in(0),
    "min.compaction.lag.ms": _int_in(0),
    "max.compaction.lag.ms": _int_in(1),
    "min.cleanable.dirty.ratio": str,
    "file.delete.delay.ms": _int_in(0),
    "preallocate": str,
    "message.downconversion.enable": str,
    "local.retention.ms": _int_in(-2),
    "local.retention.bytes": _int_in(-2),
    "remote.storage.enable": str,
}


@dataclass
class TopicInfo:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)   # overrides only, Kafka names
    internal: bool = False
    topic_id: str = ""                                      # UUID string (Metadata v10+)
    state: str = LIVE

    @property
    def cleanup_policy(self) -> str:
        return self.config.get("cleanup.policy", "delete")

    def to_json(self) -> dict[str, object]:
        return {"partitions": self.partitions, "config": self.config, "internal": self.internal,
                "topic_id": self.topic_id, "state": self.state}

    @classmethod
    def from_json(cls, name: str, d: dict[str, Any]) -> "TopicInfo":
        # `d` is a decoded JSON object: each field is converted to its kind here.
        return cls(name, int(d["partitions"]), {str(k): str(v) for k, v in d.get("config", {}).items()},
                   bool(d.get("internal", False)), str(d.get("topic_id", "")), str(d.get("state", LIVE)))


def validate_topic_name(name: str, *, internal: bool = False) -> tuple[KafkaError, str]:
    if not isinstance(name, str) or not name:
        return KafkaError.INVALID_TOPIC_EXCEPTION, "topic name is empty"
    if name in (".", ".."):
        return KafkaError.INVALID_TOPIC_EXCEPTION, f"topic name cannot be {name!r}"
    if len(name) > MAX_TOPIC_NAME:
        return KafkaError.INVALID_TOPIC_EXCEPTION, f"topic name is longer than {MAX_TOPIC_NAME} characters"
    if not _LEGAL.match(name):
        return KafkaError.INVALID_TOPIC_EXCEPTION, "topic names may use only a-z A-Z 0-9 . _ -"
    if name.startswith("__") and not internal:
        return KafkaError.INVALID_TOPIC_EXCEPTION, "names beginning with '__' are reserved for internal topics"
    return KafkaError.NONE, ""


def validate_topic_config(config: dict[str, str] | None) -> tuple[KafkaError, str, dict[str, str]]:
    """(error, message, normalised config). Unknown keys and bad values are INVALID_CONFIG."""
    out: dict[str, str] = {}
    for key, value in (config or {}).items():
        if value is None:
            continue  # a null value means "use the default"
        parser = LOG_CONFIG_KEYS[key][1] if key in LOG_CONFIG_KEYS else OTHER_CONFIG_KEYS.get(key)
        if parser is None:
            return KafkaError.INVALID_CONFIG, f"unknown topic config {key!r}", {}
        try:
            out[key] = str(parser(str(value)))
        except ValueError as exc:
            return KafkaError.INVALID_CONFIG, f"{key}={value!r}: {exc}", {}
    return KafkaError.NONE, "", out


def log_config_for(default: LogConfig, overrides: dict[str, str]) -> LogConfig:
    changes = {LOG_CONFIG_KEYS[k][0]: LOG_CONFIG_KEYS[k][1](v) for k, v in overrides.items() if k in LOG_CONFIG_KEYS}
    return default.with_overrides(**changes)


def _collision_key(name: str) -> str:
    # '.' and '_' map to the same metric name in Kafka tooling; Kafka refuses such pairs.
    return name.replace(".", "_")


class LogManager:
    """Opens every partition log at start; all calls come from one thread (the broker loop)."""

    def __init__(self, data_dir: Path | str, default_config: LogConfig | None = None,
                 fs: FileSystem | None = None):
        self.data_dir = Path(data_dir)
        self.default_config = (default_config or LogConfig()).validate()
        self.fs = fs or FileSystem()
        self.reads_wait_for_fsync = False
        self._topics: dict[str, TopicInfo] = {}
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        # (log end offset at the last compaction pass, when a tombstone it kept expires)
        self._cleaned_upto: dict[Path, tuple[int, int | None]] = {}
        self.last_error_message = ""
        # How the previous run on this directory ended: NEW (no catalogue: a first start,
        # or a disk that lost everything), CLEAN (closed by close()) or UNCLEAN.
        self.last_stop = NEW
        try:
            self.fs.makedirs(self.data_dir)
            self.fs.unlink(self.data_dir / (CATALOGUE + ".tmp"))
            self.last_stop = self._take_clean_stop()
            self._topics = self._load_catalogue()
            self._finish_deletions()
            for info in self._topics.values():
                self._open_logs(info, range(info.partitions))
        except OSError as exc:
            self._close_logs()
            raise StorageError(f"cannot open data directory {self.data_dir}: {exc}") from exc
        except StorageError:
            self._close_logs()
            raise

    def _take_clean_stop(self) -> str:
        """How the last run ended; the marker goes (durably) before anything is written,
        so a crash from here on reads as unclean at the next open."""
        marker = self.data_dir / CLEAN_STOP
        if self.fs.exists(marker):
            self.fs.unlink(marker)
            self.fs.fsync_dir(self.data_dir)
            return CLEAN
        return UNCLEAN if self.fs.exists(self.data_dir / CATALOGUE) else NEW

    def _mark_clean_stop(self) -> None:
        self.fs.write_atomic(self.data_dir / CLEAN_STOP, b"", sync_dir=True)

    # -- catalogue ---------------------------------------------------------------------
    def _load_catalogue(self) -> dict[str, TopicInfo]:
        path = self.data_dir / CATALOGUE
        try:
            raw = self.fs.read_file(path)
        except FileNotFoundError:
            return {}
        head, sep, body = raw.partition(b"\n")
        text = head.decode("ascii", "replace")
        if not sep or not text.startswith(_HEADER):
            raise StorageError(f"{path}: not a semel topic catalogue")
        if checked_file.decode(_HEADER, raw) is None:
            raise StorageError(f"{path}: checksum mismatch; refusing to guess which topics exist")
        try:
            data = json.loads(body)
            return {name: TopicInfo.from_json(name, d) for name, d in data["topics"].items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"{path}: unreadable topic catalogue: {exc}") from exc

    def _write_catalogue(self, topics: dict[str, TopicInfo]) -> None:
        body = json.dumps({"topics": {n: t.to_json() for n, t in sorted(topics.items())}},
                          indent=1, sort_keys=True).encode()
        checked_file.write(self.fs, self.data_dir / CATALOGUE, checked_file.encode(_HEADER, body), sync_dir=True)

    def _commit(self, topics: dict[str, TopicInfo]) -> bool:
        """Write the catalogue; on success adopt it. False (and memory unchanged) on failure."""
        try:
            self._write_catalogue(topics)
        except OSError as exc:
            self.last_error_message = f"cannot write the topic catalogue: {exc}"
            log.error("%s", self.last_error_message)
            return False
        self._topics = topics
        return True

    def _finish_deletions(self) -> None:
        pending = [t for t in self._topics.values() if t.state == DELETING]
        for info in pending:
            self._remove_dirs(info.name, info.partitions)
        if pending:
            topics = {n: t for n, t in self._topics.items() if t.state != DELETING}
            self._write_catalogue(topics)
            self._topics = topics

    # -- partition directories --------------------------------------------------------------
    def partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    def _open_logs(self, info: TopicInfo, partitions: Iterable[int]) -> None:
        cfg = log_config_for(self.default_config, info.config)
        for p in partitions:
            plog = PartitionLog.open(self.partition_dir(info.name, p), cfg, self.fs)
            plog.reads_wait_for_fsync = self.reads_wait_for_fsync
            self._logs[(info.name, p)] = plog

    def set_reads_wait_for_fsync(self, on: bool) -> None:
        """Every log, open now or later, counts only its fsynced end as its own (a broker
        under flush_mode "always"; PartitionLog.durable_end)."""
        self.reads_wait_for_fsync = on
        for plog in self._logs.values():
            plog.reads_wait_for_fsync = on

    def _remove_dirs(self, topic: str, partitions: int, start: int = 0) -> None:
        for p in range(start, partitions):
            plog = self._logs.pop((topic, p), None)
            if plog is not None:
                plog.abandon()
            d = self.partition_dir(topic, p)
            if self.fs.exists(d):
                self.fs.rmtree(d)
        self.fs.fsync_dir(self.data_dir)

    def _clear_strays(self, topic: str, partitions: Iterable[int]) -> None:
        """Directories of a name no topic owns (left by hand or by a lost catalogue) must
        not leak old records into a new topic."""
        for p in partitions:
            d = self.partition_dir(topic, p)
            if self.fs.exists(d):
                log.warning("removing stray partition directory %s", d)
                self.fs.rmtree(d)

    # -- public API ---------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, config: dict[str, str] | None = None, *,
                     internal: bool = False, topic_id: str | None = None) -> KafkaError:
        """`topic_id`: the cluster's id for the topic (a broker in a cluster keeps it, so it
        can tell its logs of a deleted topic from those of one created again); new if None."""
        err, msg = validate_topic_name(name, internal=internal)
        if err is KafkaError.NONE:
            if name in self._topics:
                err, msg = KafkaError.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
            elif any(_collision_key(t) == _collision_key(name) for t in self._topics):
                err, msg = KafkaError.INVALID_TOPIC_EXCEPTION, f"topic {name!r} collides with an existing name"
            elif not isinstance(partitions, int) or partitions < 1:
                err, msg = KafkaError.INVALID_PARTITIONS, "a topic needs at least one partition"
        checked: dict[str, str] = {}
        if err is KafkaError.NONE:
            err, msg, checked = validate_topic_config(config)
        if err is KafkaError.NONE:
            try:
                log_config_for(self.default_config, checked)
            except ValueError as exc:
                err, msg = KafkaError.INVALID_CONFIG, str(exc)
        self.last_error_message = msg
        if err is not KafkaError.NONE:
            return err
        info = TopicInfo(name, partitions, checked, internal, topic_id or str(uuid.uuid4()))
        try:
            self._clear_strays(name, range(partitions))
        except OSError as exc:
            self.last_error_message = f"cannot clear stray directories: {exc}"
            return KafkaError.KAFKA_STORAGE_ERROR
        if not self._commit({**self._topics, name: info}):
            return KafkaError.KAFKA_STORAGE_ERROR
        try:
            self._open_logs(info, range(partitions))
        except StorageError as exc:
            # Committed but unusable: take it back so clients do not see a broken topic.
            self.last_error_message = str(exc)
            self._undo_create(info)
            return KafkaError.KAFKA_STORAGE_ERROR
        return KafkaError.NONE

    def _undo_create(self, info: TopicInfo) -> None:
        try:
            self._remove_dirs(info.name, info.partitions)
        except OSError:
            pass
        self._commit({n: t for n, t in self._topics.items() if n != info.name})

    def create_partitions(self, name: str, count: int) -> KafkaError:
        """Grow a topic to count partitions (Kafka never shrinks a topic)."""
        info = self._topics.get(name)
        if info is None or info.state != LIVE:
            self.last_error_message = f"unknown topic {name!r}"
            return KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        if not isinstance(count, int) or count <= info.partitions:
            self.last_error_message = f"topic {name!r} already has {info.partitions} partitions"
            return KafkaError.INVALID_PARTITIONS
        try:
            self._clear_strays(name, range(info.partitions, count))
        except OSError as exc:
            self.last_error_message = str(exc)
            return KafkaError.KAFKA_STORAGE_ERROR
        grown = TopicInfo(name, count, info.config, info.internal, info.topic_id)
        if not self._commit({**self._topics, name: grown}):
            return KafkaError.KAFKA_STORAGE_ERROR
        try:
            self._open_logs(grown, range(info.partitions, count))
        except StorageError as exc:
            self.last_error_message = str(exc)
            return KafkaError.KAFKA_STORAGE_ERROR
        return KafkaError.NONE

    def set_topic_config(self, name: str, config: dict[str, str]) -> KafkaError:
        """Replace a topic's overrides (AlterConfigs semantics); applies to open logs at once."""
        info = self._topics.get(name)
        if info is None or info.state != LIVE:
            self.last_error_message = f"unknown topic {name!r}"
            return KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        err, msg, config = validate_topic_config(config)
        if err is KafkaError.NONE:
            try:
                cfg = log_config_for(self.default_config, config)
            except ValueError as exc:
                err, msg = KafkaError.INVALID_CONFIG, str(exc)
        self.last_error_message = msg
        if err is not KafkaError.NONE:
            return err
        changed = TopicInfo(name, info.partitions, config, info.internal, info.topic_id)
        if not self._commit({**self._topics, name: changed}):
            return KafkaError.KAFKA_STORAGE_ERROR
        for p in range(info.partitions):
            plog = self._logs.get((name, p))
            if plog is not None:
                plog.config = cfg
        return KafkaError.NONE

    def delete_topic(self, name: str, *, internal: bool = False) -> KafkaError:
        info = self._topics.get(name)
        if info is None or info.state != LIVE:
            self.last_error_message = f"unknown topic {name!r}"
            return KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        if info.internal and not internal:
            self.last_error_message = f"internal topic {name!r} cannot be deleted"
            return KafkaError.INVALID_TOPIC_EXCEPTION
        marked = TopicInfo(name, info.partitions, info.config, info.internal, info.topic_id, DELETING)
        if not self._commit({**self._topics, name: marked}):
            return KafkaError.KAFKA_STORAGE_ERROR
        try:
            self._remove_dirs(name, info.partitions)
        except OSError as exc:
            # Already gone for clients; the next start finishes the removal.
            log.error("deleting topic %s: %s (finished at next start)", name, exc)
            return KafkaError.NONE
        self._commit({n: t for n, t in self._topics.items() if n != name})
        return KafkaError.NONE

    def topics(self) -> dict[str, TopicInfo]:
        return {n: t for n, t in self._topics.items() if t.state == LIVE}

    def topic(self, name: str) -> TopicInfo | None:
        """One live topic's info: what topics()[name] gives, without building the dict
        of every topic (the produce path asks once per partition it appends to)."""
        info = self._topics.get(name)
        return info if info is not None and info.state == LIVE else None

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        return self._logs.get((topic, partition))

    def reopen(self, topic: str, partition: int) -> PartitionLog:
        """Open a partition's log again from its files (recovery cuts whatever does not
        check out), dropping the open one unflushed: how a log whose disk failed comes
        back once the disk works. StorageError when it cannot (the old log stays in its
        place, closed: every use of it is refused until a reopen succeeds)."""
        info = self._topics.get(topic)
        old = self._logs.get((topic, partition))
        if info is None or old is None:
            raise StorageError(f"{topic}-{partition}: no such partition here")
        if not old.closed:
            old.abandon()       # first: never two logs on one set of files
        try:
            new = PartitionLog.open(self.partition_dir(topic, partition),
                                    log_config_for(self.default_config, info.config), self.fs)
        except OSError as exc:
            raise StorageError(f"cannot reopen {topic}-{partition}: {exc}") from exc
        new.reads_wait_for_fsync = self.reads_wait_for_fsync
        self._logs[(topic, partition)] = new
        return new

    def all_logs(self) -> Iterator[tuple[tuple[str, int], PartitionLog]]:
        return iter(list(self._logs.items()))

    def set_default(self, field: str, value: int | str) -> None:
        """Change a default every topic without its own override follows (a dynamic broker
        config such as log.retention.ms): new topics get it, open logs at once."""
        self.default_config = self.default_config.with_overrides(**{field: value})
        for (topic, _), plog in self.all_logs():
            info = self._topics.get(topic)
            plog.config = log_config_for(self.default_config, info.config if info is not None else {})

    def enforce_retention(self, now_ms: int) -> int:
        """Apply retention to every log whose topic deletes old data, and clean the logs
        of compacted topics; returns segments deleted."""
        deleted = 0
        for (topic, _), plog in self.all_logs():
            info = self._topics.get(topic)
            if info is None:
                continue
            policy = info.cleanup_policy.split(",")
            try:
                if "compact" in policy and not info.internal:
                    self._clean(plog, info, now_ms)
                if "delete" in policy:
                    deleted += plog.enforce_retention(now_ms)
            except StorageError as exc:
                log.warning("retention of %s failed: %s", plog.directory, exc)
        return deleted

    def _clean(self, plog: PartitionLog, info: TopicInfo, now_ms: int) -> None:
        """Compact when something was written since the last pass, or a tombstone the
        last pass kept has outlived delete.retention.ms (a pass reads the log)."""
        upto, tombstone_due = self._cleaned_upto.get(plog.directory, (None, None))
        if upto == plog.log_end_offset and (tombstone_due is None or now_ms < tombstone_due):
            return
        retention = int(info.config.get("delete.retention.ms", DEFAULT_DELETE_RETENTION_MS))
        result = compaction.clean(plog, now_ms, retention)
        self._cleaned_upto[plog.directory] = (plog.log_end_offset, result.next_tombstone_expiry_ms)
        if result.records_removed:
            log.info("compacted %s: %d records removed from %d segments", plog.directory,
                     result.records_removed, result.segments_rewritten)

    def close(self) -> None:
        """Close every log (flush + clean checkpoint). Raises StorageError if any failed."""
        errors = self._close_logs()
        if errors:
            raise StorageError("; ".join(errors))
        try:
            self._mark_clean_stop()
        except OSError as exc:
            raise StorageError(f"{self.data_dir}: cannot record the clean stop: {exc}") from exc

    def _close_logs(self) -> list[str]:
        errors = []
        for _, plog in list(self._logs.items()):
            try:
                plog.close()
            except StorageError as exc:
                errors.append(str(exc))
        self._logs.clear()
        return errors

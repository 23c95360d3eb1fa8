"""The driver side's view of a streaming query's checkpoint, through pyarrow.fs.

The exactly-once sink needs two things Spark journals in the checkpoint: the
query's id (`<checkpoint>/metadata`, the lineage its batch numbers belong to) and
a batch's source end offsets (`<checkpoint>/offsets/<batch>`). Only driver-side
code reads them (streamWriter(), commit(), a foreachBatch function): on a real
cluster the checkpoint is the driver's (a local disk, HDFS, an object store), and
executors must not need to reach it. Tasks get what they need on the writer object.

Every scheme a Spark checkpoint may use is opened with pyarrow.fs: a plain path
or `file:`, `hdfs:` (needs libhdfs, as pyarrow's HadoopFileSystem does), `s3a:`,
`s3n:` and `s3:` (S3FileSystem, with Spark's S3A settings mapped, below), `gs:`
and `gcs:`, `abfs:` and `abfss:`. S3A settings are Hadoop's names, with or
without Spark's `spark.hadoop.` prefix; those not given fall back to pyarrow's own
defaults (the AWS_* environment variables, ~/.aws).
"""
from __future__ import annotations

import json
from typing import Mapping
from urllib.parse import urlsplit

_S3 = ("s3a", "s3n", "s3")
_FROM_URI = ("hdfs", "gs", "gcs", "abfs", "abfss")


class CheckpointError(Exception):
    """A checkpoint location this reader cannot open; one readable line."""


def hadoop_settings(conf: Mapping[str, str]) -> dict[str, str]:
    """The `fs.*` Hadoop settings among Spark conf entries (`spark.hadoop.fs.x` -> `fs.x`),
    the ones a checkpoint file system is opened with."""
    out: dict[str, str] = {}
    for key, value in conf.items():
        name = key[len("spark.hadoop."):] if key.startswith("spark.hadoop.") else key
        if name.startswith("fs.") and value is not None:
            out[name] = str(value)
    return out


def session_settings(spark=None) -> dict[str, str]:
    """hadoop_settings of a SparkSession's conf (the active one when not given; none: {})."""
    if spark is None:
        from pyspark.sql import SparkSession
        spark = SparkSession.getActiveSession()
        if spark is None:
            return {}
    return hadoop_settings(dict(spark.sparkContext.getConf().getAll()))


def s3_options(settings: Mapping[str, str]) -> dict:
    """pyarrow S3FileSystem arguments from Hadoop's S3A settings."""
    s = hadoop_settings(settings)
    kw: dict = {}
    if s.get("fs.s3a.access.key"):
        kw["access_key"] = s["fs.s3a.access.key"]
        kw["secret_key"] = s.get("fs.s3a.secret.key", "")
    if s.get("fs.s3a.session.token"):
        kw["session_token"] = s["fs.s3a.session.token"]
    region = s.get("fs.s3a.endpoint.region") or s.get("fs.s3a.region")
    if region:
        kw["region"] = region
    endpoint = s.get("fs.s3a.endpoint", "").strip()
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else "//" + endpoint)
        ssl = s.get("fs.s3a.connection.ssl.enabled", "true").strip().lower() != "false"
        kw["scheme"] = parts.scheme or ("https" if ssl else "http")
        kw["endpoint_override"] = parts.netloc
    if "fs.s3a.path.style.access" in s:
        kw["force_virtual_addressing"] = s["fs.s3a.path.style.access"].strip().lower() != "true"
    if "Anonymous" in s.get("fs.s3a.aws.credentials.provider", ""):
        kw["anonymous"] = True
    return kw


def filesystem(location: str, settings: Mapping[str, str] | None = None):
    """(pyarrow FileSystem, path within it) for a checkpoint location as Spark takes it:
    a path without a scheme is on Hadoop's default file system (`fs.defaultFS`)."""
    import pyarrow.fs as pafs
    default = hadoop_settings(settings or {}).get("fs.defaultFS", "").rstrip("/")
    if default and "://" not in location and not location.startswith("file:") and location.startswith("/"):
        location = default + location if not default.startswith("file:") else location
    scheme = urlsplit(location).scheme.lower() if "://" in location or location.startswith("file:") else ""
    if scheme in ("", "file"):
        path = urlsplit(location).path if scheme else location
        return pafs.LocalFileSystem(), path
    if scheme in _S3:
        parts = urlsplit(location)
        return pafs.S3FileSystem(**s3_options(settings or {})), f"{parts.netloc}{parts.path}".rstrip("/")
    if scheme in _FROM_URI:
        try:
            return pafs.FileSystem.from_uri(location)
        except Exception as exc:  # pyarrow raises several types; the cause goes in the message
            raise CheckpointError(f"cannot open checkpoint location {location}: {exc}") from None
    raise CheckpointError(f"checkpoint location {location}: scheme {scheme!r} is not supported "
                          f"(file, hdfs, {', '.join(_S3)}, gs, abfs)")


def _in_task() -> bool:
    try:
        from pyspark import TaskContext
    except ImportError:
        return False
    return TaskContext.get() is not None


class Checkpoint:
    """Reads of one query's checkpoint (driver side only: a task raises)."""

    def __init__(self, location: str, settings: Mapping[str, str] | None = None):
        if _in_task():
            raise CheckpointError("a Spark task must not read the query's checkpoint: the writer carries "
                                  "what tasks need")
        self.location = location
        self.fs, self.root = filesystem(location, settings)

    def _text(self, *names: str) -> str | None:
        import pyarrow as pa
        path = "/".join([self.root.rstrip("/"), *names])
        try:
            with self.fs.open_input_stream(path) as f:
                return f.read().decode("utf-8")
        except FileNotFoundError:
            return None
        except (OSError, pa.ArrowException) as exc:
            raise CheckpointError(f"cannot read {path} of checkpoint {self.location}: {exc}") from None

    def query_id(self) -> str | None:
        """Spark's query id (`metadata`); None before Spark wrote it."""
        text = self._text("metadata")
        try:
            return json.loads(text).get("id") if text else None
        except (ValueError, AttributeError):
            return None

    def offset_lines(self, batch: int) -> list[str] | None:
        """`offsets/<batch>` as lines ("v1", Spark's metadata, one line per source); None if absent."""
        text = self._text("offsets", str(batch))
        return text.splitlines() if text is not None else None

    def latest_batch(self) -> int | None:
        """The newest batch in the offset log: the one Spark is running while it plans a
        micro-batch (it writes `offsets/<batch>` before planning it). None if none yet."""
        import pyarrow.fs as pafs
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(f"{self.root.rstrip('/')}/offsets", allow_not_found=True))
        except OSError as exc:
            raise CheckpointError(f"cannot list the offset log of checkpoint {self.location}: {exc}") from None
        batches = [int(i.base_name) for i in infos if i.type == pafs.FileType.File and i.base_name.isdigit()]
        return max(batches) if batches else None

    def has_state(self) -> bool:
        """Whether the query keeps state (an aggregation, a join, dropDuplicates): Spark
        writes `state/` once a stateful operator's first batch has run."""
        import pyarrow.fs as pafs
        try:
            return self.fs.get_file_info(f"{self.root.rstrip('/')}/state").type == pafs.FileType.Directory
        except OSError:
            return False


def shuffle_partitions(offset_lines: list[str] | None) -> int | None:
    """spark.sql.shuffle.partitions as the offset log recorded it (Spark's metadata line:
    the value a stateful query keeps for the life of its checkpoint)."""
    try:
        return int(json.loads(offset_lines[1])["conf"]["spark.sql.shuffle.partitions"])
    except (TypeError, IndexError, KeyError, ValueError):
        return None


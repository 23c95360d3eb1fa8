"""The `semel` data source: one class Spark knows by name, delegating reads to
source.py and writes to sink.py (imported lazily: each runs in its own Python
worker, and a reader need not pay for the writer's imports)."""
from __future__ import annotations

from pyspark.sql.datasource import DataSource


class SemelDataSource(DataSource):
    # Hadoop `fs.*` settings of the session that registered the source (register()): the
    # driver-side reads of an object-store checkpoint open it with them
    fs_settings: dict = {}

    @classmethod
    def name(cls) -> str:
        return "semel"

    def schema(self):
        from .source import source_schema
        return source_schema(self.options)

    def reader(self, schema):
        from .source import make_batch_reader
        return make_batch_reader(self.options, schema)

    def streamReader(self, schema):
        from .source import make_stream_reader
        return make_stream_reader(self.options, schema)

    def writer(self, schema, overwrite: bool):
        from .sink import make_batch_writer
        return make_batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        from .sink import make_stream_writer
        return make_stream_writer(self.options, schema, overwrite, self.fs_settings)


def register(spark) -> None:
    """Make `format("semel")` known to this SparkSession. Its `spark.hadoop.fs.*`
    settings (S3A endpoint, keys, ...) go with the source to the driver-side Python
    workers, which have no SparkSession to ask: a class made here is pickled by value."""
    from .checkpoint import session_settings
    spark.dataSource.register(source_class(session_settings(spark)))


def source_class(fs_settings: dict) -> type:
    """SemelDataSource, or a subclass made here (so pickled by value) that carries the settings."""
    if not fs_settings:
        return SemelDataSource
    return type("SemelDataSource", (SemelDataSource,), {"fs_settings": dict(fs_settings)})

"""`format("semel")` without register(): at startup Spark 4 imports every top-level
module whose name starts with `pyspark_` and registers its `DefaultSource` under
the source's name."""
from semel.spark.datasource import SemelDataSource as DefaultSource

__all__ = ["DefaultSource"]

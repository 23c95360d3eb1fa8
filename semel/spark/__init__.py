"""semel on Apache Spark (PySpark Python Data Source API, pyspark 4.3).

    from semel.spark import register
    register(spark)                       # optional: Spark 4 finds pyspark_semel itself
    spark.readStream.format("semel")...   # source: semel/spark/source.py
    df.writeStream.format("semel")...     # exactly-once sink: semel/spark/sink.py
    df.writeStream.outputMode("update").foreachBatch(write_each_batch(opts))  # semel/spark/each_batch.py

Like the rest of the client side, this package talks to brokers only over the
Kafka wire protocol, so it works against any Kafka-compatible broker.
"""
from .datasource import SemelDataSource, register
from .session import local_session

__all__ = ["SemelDataSource", "local_session", "register"]

"""The README's ten-line PySpark example: numbers from demo-input, doubled, exactly once
into demo-output.  python examples/spark_double.py [BOOTSTRAP] [CHECKPOINT_DIR]"""
import sys

from pyspark.sql import SparkSession

from semel.spark import register

bootstrap = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9092"
checkpoint = sys.argv[2] if len(sys.argv) > 2 else "/tmp/ck-double"
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
register(spark)                                  # format("semel") for readStream and writeStream
nums = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "demo-input").option("startingOffsets", "earliest").load())
out = nums.selectExpr("key", "cast(cast(cast(value as string) as int) * 2 as string) as value")
(out.writeStream.format("semel").option("kafka.bootstrap.servers", bootstrap)
    .option("topic", "demo-output").option("checkpointLocation", checkpoint).start()
    .awaitTermination())

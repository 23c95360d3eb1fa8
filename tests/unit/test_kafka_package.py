"""semel.protocol.kafka_package: kafka-python's codec without its client, and the client
as ever once asked for, whatever is imported first (each case in a fresh interpreter:
the package is set up once per process)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

_CLIENT = ("kafka.producer", "kafka.consumer", "kafka.admin", "kafka.net", "kafka.cluster")


def fresh(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_the_codec_imports_none_of_the_client():
    got = fresh("import sys, semel.protocol.messages\n"
                "from semel.protocol.kafka_package import is_deferred\n"
                f"print(is_deferred(), [m for m in {_CLIENT!r} if m in sys.modules])")
    assert got == "True []"


@pytest.mark.parametrize("first", [
    "from kafka import KafkaProducer, KafkaConsumer, KafkaAdminClient",
    "import kafka.cluster",                      # kafka-python's circle: only its __init__'s order resolves it
    "from kafka.admin import KafkaAdminClient, NewTopic",
    "import kafka.producer.kafka",
    "from kafka import *",
    "import kafka; kafka.__version__",
])
def test_the_client_is_the_same_whatever_comes_first(first):
    got = fresh("import sys, semel.protocol.messages\n"
                f"{first}\n"
                "import kafka, kafka.cluster, kafka.producer.kafka\n"
                "from semel.protocol.kafka_package import is_deferred\n"
                "print(is_deferred(), kafka.KafkaProducer is kafka.producer.kafka.KafkaProducer,"
                " sys.modules['kafka.cluster'] is kafka.cluster, kafka.cluster.__spec__.origin.endswith('cluster.py'),"
                " kafka.__version__ == __import__('importlib.metadata').metadata.version('kafka-python'),"
                # each module once: every one its parent's attribute, with its own file's loader
                " all(getattr(sys.modules[n.rpartition('.')[0]], n.rpartition('.')[2], None) is m"
                "     and type(m.__spec__.loader).__name__ == 'SourceFileLoader'"
                "     for n, m in list(sys.modules.items()) if n.startswith('kafka.')"
                "     and n != 'kafka.protocol.schemas.load_json'))")  # a function of that name shadows it
    assert got == "False True True True True True"


def test_the_protocol_modules_import_alone_and_the_client_still_works_after():
    got = fresh("import semel.protocol.messages\n"
                "from kafka.errors import KafkaError\n"
                "from kafka.partitioner.default import murmur2\n"
                "from kafka.protocol.producer import ProduceRequest\n"
                "from semel.protocol.kafka_package import is_deferred\n"
                "d = is_deferred()\n"
                "from kafka import KafkaProducer\n"
                "print(d, is_deferred(), KafkaProducer.__module__)")
    assert got == "True False kafka.producer.kafka"

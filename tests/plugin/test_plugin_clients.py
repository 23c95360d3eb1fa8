"""The plugin as an outside project uses it: confluent-kafka, kafka-python and
aiokafka round trips on the shared broker, its faults, a fresh broker, SASL and TLS
brokers and the 3-broker cluster (projects/clients.py)."""
from __future__ import annotations

import re

from tests.support.plugin_projects import PROJECTS


def test_clients_against_the_fixtures(project):
    # The project's top-level test functions, read without ast.parse: on Python 3.11 the
    # AST builder keeps its recursion count in state shared by every thread, so a client
    # thread formatting a traceback at the same time made it fail with "AST constructor
    # recursion depth mismatch".
    expected = set(re.findall(r"^def (test_\w+)\(", (PROJECTS / "clients.py").read_text(), re.M))
    out = project({"test_clients.py": "clients.py"})
    assert out.passed() == expected, out.output[-4000:]
    assert out.returncode == 0


def test_exactly_once_through_a_broker_kill(project):
    """confluent-kafka's transactional consume-transform-produce, the broker SIGKILLed
    and restarted mid-transaction (projects/eos_confluent.py)."""
    out = project({"test_eos.py": "eos_confluent.py"})
    assert out.results == {"test_exactly_once_through_a_broker_kill": "passed"}, out.output[-4000:]


def test_faststream_app(project):
    """A FastStream app (its aiokafka broker) through a broker restart
    (projects/faststream_app.py)."""
    out = project({"test_app.py": "faststream_app.py"})
    assert out.results == {"test_faststream_round_trip_and_a_restart": "passed"}, out.output[-4000:]

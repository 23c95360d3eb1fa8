"""The plugin as an outside project uses it: confluent-kafka, kafka-python and
aiokafka round trips on the shared broker, its faults, a fresh broker, SASL and TLS
brokers and the 3-broker cluster (projects/clients.py)."""
from __future__ import annotations

import ast

from tests.support.plugin_projects import PROJECTS


def test_clients_against_the_fixtures(project):
    expected = {n.name for n in ast.parse((PROJECTS / "clients.py").read_text()).body
                if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
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

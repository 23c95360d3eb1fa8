"""The pytest plugin: real semel brokers as fixtures (docs/testing.md).

pytest loads it through the `pytest11` entry point once semel is installed. Nothing
here starts before a test asks for a fixture, and every process a fixture starts is
gone when the run ends (semel.testing.reaper says how).

Fixtures:
  semel_broker            the run's shared broker; after each test it is resumed and,
                          if killed, restarted (topics from semel_topic are per test)
  semel_session_broker    the same broker, for session-scoped fixtures of your own
  semel_broker_fresh      a broker of the test's own
  semel_broker_factory    make(security=, power_cut=, network=, args=, port=) -> Broker
  semel_broker_sasl       a shared SASL_PLAINTEXT broker (SCRAM-SHA-256 user)
  semel_broker_tls        a shared SSL broker (a throwaway CA)
  semel_cluster           the run's shared 3-broker cluster on etcd (the `cluster` extra)
  semel_bootstrap         semel_broker's bootstrap string
  semel_topic             make a uniquely named topic on semel_broker, deleted after the test
  semel_cluster_topic     the same on semel_cluster (replication factor 3)
  semel_confluent_config, semel_kafka_python_config, semel_aiokafka_config
                          settings for semel_broker, to splat into each library's client
"""
from __future__ import annotations

from pathlib import Path

import pytest

# pytest imports this module in every run wherever semel is installed, most of them
# using none of its fixtures: the broker handles (and semel's client and protocol under
# them) are imported when a fixture first starts something.


def pytest_addoption(parser) -> None:
    g = parser.getgroup("semel", "semel brokers (semel.testing.pytest_plugin)")
    g.addoption("--semel-port", type=int, default=None,
                help="port of semel_broker (default: a free one)")
    g.addoption("--semel-data-dir", default=None,
                help="where semel_broker keeps its data (default: pytest's temporary directory)")
    g.addoption("--semel-broker-arg", action="append", default=[], metavar="ARG",
                help="one more `semel broker start` flag for every broker the fixtures start (repeatable; "
                     "--semel-broker-arg=--flush-mode=never)")
    g.addoption("--semel-start-timeout", type=float, default=30.0,
                help="seconds a broker may take to listen before its fixture fails (default 30)")


def start(make):
    """make() started, or the test's set-up failed with the broker's own last word
    (or skipped where a fault it asks for cannot be had here)."""
    from .broker import BrokerStartError, FaultUnavailable
    try:
        return make().start()
    except BrokerStartError as exc:
        pytest.fail(str(exc), pytrace=False)
    except FaultUnavailable as exc:
        pytest.skip(str(exc))
    except FileNotFoundError as exc:   # etcd (the `cluster` extra) or a broker's data dir
        pytest.fail(f"cannot start semel: {exc}", pytrace=False)


class _Settings:
    def __init__(self, config):
        self.port = config.getoption("--semel-port")
        self.data_dir = config.getoption("--semel-data-dir")
        self.args = tuple(config.getoption("--semel-broker-arg"))
        self.timeout = config.getoption("--semel-start-timeout")

    def broker(self, base: Path, **kw):
        from .broker import Broker
        kw.setdefault("extra_args", ())
        kw["extra_args"] = (*self.args, *kw["extra_args"])
        return Broker.create(base, start_timeout_s=self.timeout, **kw)


@pytest.fixture(scope="session")
def _semel_settings(pytestconfig) -> _Settings:
    return _Settings(pytestconfig)


def _shared(tmp_path_factory, settings: _Settings, name: str, **kw):
    broker = start(lambda: settings.broker(tmp_path_factory.mktemp(name), **kw))
    yield broker
    broker.close()


@pytest.fixture(scope="session")
def semel_session_broker(tmp_path_factory, _semel_settings):
    data_dir = Path(_semel_settings.data_dir) if _semel_settings.data_dir else None
    yield from _shared(tmp_path_factory, _semel_settings, "semel-broker", port=_semel_settings.port,
                       data_dir=data_dir)


def _recovered(handle):
    """Hand a shared handle to a test, then undo the faults it left behind."""
    from .broker import BrokerStartError
    yield handle
    try:
        handle.recover()
    except BrokerStartError as exc:
        pytest.fail(f"the shared semel broker did not come back after the test: {exc}", pytrace=False)


@pytest.fixture
def semel_broker(semel_session_broker):
    yield from _recovered(semel_session_broker)


@pytest.fixture(scope="session")
def semel_broker_sasl(tmp_path_factory, _semel_settings):
    from .security import ClientSecurity
    yield from _shared(tmp_path_factory, _semel_settings, "semel-sasl", security=ClientSecurity("SASL_PLAINTEXT"))


@pytest.fixture(scope="session")
def semel_broker_tls(tmp_path_factory, _semel_settings):
    from .security import ClientSecurity
    yield from _shared(tmp_path_factory, _semel_settings, "semel-tls", security=ClientSecurity("SSL"))


@pytest.fixture
def semel_broker_factory(tmp_path, _semel_settings):
    """make(security="PLAINTEXT"|"SSL"|"SASL_PLAINTEXT"|"SASL_SSL", power_cut=False,
    network=False, args=(), port=None) -> a started Broker of this test's own."""
    from .security import ClientSecurity
    made: list = []

    def make(security: str = "PLAINTEXT", power_cut: bool = False, network: bool = False,
             args: tuple[str, ...] = (), port: int | None = None):
        base = tmp_path / f"semel-broker-{len(made)}"
        broker = start(lambda: _semel_settings.broker(base, security=ClientSecurity(security), power_cut=power_cut,
                                                      network=network, extra_args=tuple(args), port=port))
        made.append(broker)
        return broker

    yield make
    for broker in reversed(made):
        broker.close()


@pytest.fixture
def semel_broker_fresh(semel_broker_factory):
    return semel_broker_factory()


@pytest.fixture(scope="session")
def _semel_session_cluster(tmp_path_factory, _semel_settings):
    from .cluster import Cluster
    cluster = start(lambda: Cluster(tmp_path_factory.mktemp("semel-cluster"), extra_args=_semel_settings.args,
                                    start_timeout_s=max(_semel_settings.timeout, 60.0)))
    yield cluster
    cluster.close()


@pytest.fixture
def semel_cluster(_semel_session_cluster):
    yield from _recovered(_semel_session_cluster)


@pytest.fixture
def semel_bootstrap(semel_broker) -> str:
    return semel_broker.bootstrap_servers


def _topics(factory):
    yield factory
    factory.close()


@pytest.fixture
def semel_topic(semel_broker, request):
    """semel_topic(name=None, partitions=1, config=None) -> the new topic's name."""
    yield from _topics(semel_broker.topics(request.node.name))


@pytest.fixture
def semel_cluster_topic(semel_cluster, request):
    yield from _topics(semel_cluster.topics(request.node.name))


@pytest.fixture
def semel_confluent_config(semel_broker) -> dict:
    return semel_broker.client_configs()["confluent"]


@pytest.fixture
def semel_kafka_python_config(semel_broker) -> dict:
    return semel_broker.client_configs()["kafka_python"]


@pytest.fixture
def semel_aiokafka_config(semel_broker) -> dict:
    return semel_broker.client_configs()["aiokafka"]

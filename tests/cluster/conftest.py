import pytest

from tests.support.markers import starts_processes

from semel.launch.etcd import EtcdProcess


@pytest.fixture(scope="module")
@starts_processes
def etcd(tmp_path_factory):
    """One real etcd process per module that asks for it."""
    d = tmp_path_factory.mktemp("etcd")
    with EtcdProcess(d / "data", log_path=d / "etcd.log") as proc:
        yield proc

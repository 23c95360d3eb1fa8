"""One semel broker process for a whole test module (the suite's time budget wants
one per module wherever the tests allow)."""
from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def module_broker(tmp_path_factory, name: str, *extra_args: str):
    """A started SemelBroker with its data and log under a fresh temp folder `name`."""
    from semel.launch.process import SemelBroker
    d = tmp_path_factory.mktemp(name)
    b = SemelBroker(d / "data", log_path=d / "broker.log", extra_args=list(extra_args))
    b.start()
    try:
        yield b
    finally:
        b.close()


def module_broker_fixture(name: str, *extra_args: str):
    """A module-scoped pytest fixture that yields module_broker(name, *extra_args); assign it
    to a fixture name in a test module (`broker = module_broker_fixture("fetch")`)."""
    import pytest

    from tests.support.markers import starts_processes

    @pytest.fixture(scope="module")
    @starts_processes
    def fixture(tmp_path_factory):
        with module_broker(tmp_path_factory, name, *extra_args) as b:
            yield b
    return fixture

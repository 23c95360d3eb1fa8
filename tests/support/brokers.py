"""One semel broker process for a whole test module (the suite's time budget wants
one per module wherever the tests allow)."""
from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def module_broker(tmp_path_factory, name: str, *extra_args: str):
    """A started SemelBroker with its data and log under a fresh temp folder `name`."""
    from semel.cli.process import SemelBroker
    d = tmp_path_factory.mktemp(name)
    b = SemelBroker(d / "data", log_path=d / "broker.log", extra_args=list(extra_args))
    b.start()
    try:
        yield b
    finally:
        b.close()

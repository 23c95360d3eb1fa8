"""Shared fixtures: real broker processes on loopback ports."""
from __future__ import annotations

import pytest

from semel.cli.process import SemelBroker, TansuBroker


@pytest.fixture
def start_broker(tmp_path):
    """Factory: start_broker(*extra_args, env=None, data_dir=None) -> SemelBroker (a real process)."""
    started: list[SemelBroker] = []

    def factory(*extra_args, env=None, data_dir=None, port=None):
        n = len(started)
        b = SemelBroker(data_dir or tmp_path / f"broker{n}", port=port, extra_args=list(extra_args), env=env,
                        log_path=tmp_path / f"broker{n}.log")
        started.append(b)
        return b.start()

    yield factory
    for b in started:
        b.close()


@pytest.fixture
def broker(start_broker):
    """One semel broker with auto topic creation off and fast group rebalances."""
    return start_broker("--group-initial-rebalance-delay-ms", "0", "--group-min-session-timeout-ms", "1000")


@pytest.fixture
def tansu():
    b = TansuBroker()
    b.start()
    yield b
    b.close()

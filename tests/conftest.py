"""Shared fixtures: real broker processes on loopback ports."""
from __future__ import annotations

import os

import pytest

from semel.broker.watchdog import STALL_MARKER
from semel.launch.process import SemelBroker, TansuBroker
from tests.support.markers import mark_items, starts_processes
from tests.support.services import pg_uri, s3_endpoint  # noqa: F401 - session fixtures, one server each per run

_stall_read_upto: dict = {}


def pytest_collection_modifyitems(config, items):
    """`process` and `spark` markers (see tests/support/markers.py and tests/README.md)."""
    mark_items(items)


def _new_stall_lines() -> list[str]:
    """Stall lines written to any semel broker log since the last look."""
    found = []
    for path in list(SemelBroker.log_paths):
        try:
            with open(path, "rb") as f:
                f.seek(_stall_read_upto.get(path, 0))
                data = f.read()
        except OSError:   # not started yet, or its temp folder is gone
            continue
        _stall_read_upto[path] = _stall_read_upto.get(path, 0) + len(data)
        found += [f"{path}: {line}" for line in data.decode("utf-8", "replace").splitlines()
                  if STALL_MARKER in line]
    return found


LOG_TAIL_LINES = 25


def _log_tails(since: float) -> list[tuple[str, str]]:
    """(title, last lines) of every semel broker log written to since `since` (epoch s)."""
    tails = []
    for path in dict.fromkeys(SemelBroker.log_paths):
        try:
            if os.path.getmtime(path) < since:
                continue
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - 64 * 1024))
                lines = f.read().decode("utf-8", "replace").splitlines()[-LOG_TAIL_LINES:]
        except OSError:
            continue
        tails.append((f"broker log {path} (last {len(lines)} lines)", "\n".join(lines)))
    return tails


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the tails of the broker logs written during it:
    on a CI machine, where the temp folders are gone afterwards, they are what tells a
    broker's side of a timeout."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when in ("setup", "call"):
        for title, tail in _log_tails(call.start):
            report.sections.append((title, tail))


@pytest.fixture(autouse=True)
def no_event_loop_stalls():
    """A regression net for freezes: a test fails if any semel broker process logged
    that its event loop was held past the stall bound (2 s by default) meanwhile."""
    _new_stall_lines()
    yield
    stalls = _new_stall_lines()
    assert not stalls, "a broker's event loop was held:\n" + "\n".join(stalls)


@pytest.fixture
@starts_processes
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
@starts_processes
def broker(start_broker):
    """One semel broker with auto topic creation off and fast group rebalances."""
    return start_broker("--group-initial-rebalance-delay-ms", "0", "--group-min-session-timeout-ms", "1000")


@pytest.fixture
@starts_processes
def tansu():
    b = TansuBroker()
    b.start()
    yield b
    b.close()

"""Which tests start processes (broker processes, etcd, PostgreSQL, moto_server, Tansu,
subprocess CLIs) or Spark, so `./run test -m "not process"` is a quick run of the rest.

tests/conftest.py applies these rules at collection: whole directories whose tests all
start processes, and otherwise the fixtures an item uses (declared with
`starts_processes` where they are defined). A test that starts a process in its own
body is marked by hand: `@pytest.mark.process` or a module's `pytestmark`."""
from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent

# Directories where every test runs against real processes; Spark ones also get `spark`.
PROCESS_DIRS = ("integration", "chaos", "spark", "plugin")
SPARK_DIRS = ("spark",)
# Fixtures that start Spark (a local SparkSession runs a JVM).
SPARK_FIXTURES = frozenset({"spark"})

_FLAG = "semel_starts_processes"


def starts_processes(fixture_function):
    """Declare that a fixture starts OS processes; put it under `@pytest.fixture`."""
    setattr(fixture_function, _FLAG, True)
    return fixture_function


def _top_dir(item) -> str | None:
    try:
        rel = Path(str(item.path)).resolve().relative_to(TESTS)
    except ValueError:
        return None
    return rel.parts[0] if len(rel.parts) > 1 else None


def _fixture_starts_processes(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in item.fixturenames:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            if getattr(fixturedef.func, _FLAG, False):
                return True
    return False


def mark_items(items) -> None:
    """Add the `process` and `spark` markers by the rules above."""
    for item in items:
        top = _top_dir(item)
        spark = top in SPARK_DIRS or bool(SPARK_FIXTURES & set(item.fixturenames))
        if spark:
            item.add_marker(pytest.mark.spark)
        if spark or top in PROCESS_DIRS or _fixture_starts_processes(item):
            item.add_marker(pytest.mark.process)

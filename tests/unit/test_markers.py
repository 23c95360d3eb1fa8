"""The `process` and `spark` markers land where tests/README.md says: a few tests known
to start processes or Spark carry them, a few pure unit tests do not, so
`./run test -m "not process"` stays a quick run."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROCESS = [
    "tests/integration/test_fetch.py",                   # module_broker_fixture
    "tests/integration/test_idempotence.py",             # the shared start_broker fixture
    "tests/chaos/test_broker_sigkill.py",                # directory rule
    "tests/cluster/test_etcd_view.py",                   # a module fixture that starts etcd
    "tests/cluster/test_cluster_cli.py",                 # a module's pytestmark (CLI subprocess)
    "tests/property/test_wire_fuzz.py::test_broker_still_serves_after_fuzzing",
]
SPARK = [
    "tests/spark/test_batches.py",                       # directory rule
    "tests/cluster/test_spark_cluster.py::test_an_output_leader_sigkilled_between_two_runs_keeps_it_exact",
]
PURE = [
    "tests/unit/test_codecs.py",
    "tests/unit/storage/test_storage_log.py",
    "tests/cluster/test_replication_model.py",
    "tests/cluster/test_interbroker_security.py::test_broker_info_addresses",
    "tests/property/test_wire_fuzz.py::test_any_frame_either_decodes_or_is_a_protocol_error",
]


class _Collected:
    """Records each collected item's node id and marker names."""

    def __init__(self):
        self.markers: dict[str, set[str]] = {}

    def pytest_collection_finish(self, session):
        for item in session.items:
            self.markers[item.nodeid] = {m.name for m in item.iter_markers()}


@pytest.fixture(scope="module")
def collected() -> dict[str, set[str]]:
    files = sorted({p.split("::")[0] for p in PROCESS + SPARK + PURE})
    recorder = _Collected()
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
                        *(str(ROOT / f) for f in files)], plugins=[recorder])
    assert code == pytest.ExitCode.OK
    return recorder.markers


def _items(collected, selector: str) -> list[set[str]]:
    found = [marks for nodeid, marks in collected.items()
             if nodeid == selector or nodeid.startswith(selector + "::")]
    assert found, f"nothing collected for {selector}"
    return found


@pytest.mark.parametrize("selector", PROCESS + SPARK)
def test_tests_that_start_processes_are_marked(collected, selector):
    assert all("process" in marks for marks in _items(collected, selector))


@pytest.mark.parametrize("selector", SPARK)
def test_spark_tests_are_marked_spark(collected, selector):
    assert all("spark" in marks for marks in _items(collected, selector))


@pytest.mark.parametrize("selector", PURE)
def test_pure_tests_are_not_marked(collected, selector):
    assert all(not {"process", "spark"} & marks for marks in _items(collected, selector))

"""docs/api-support.md lists exactly the API keys and versions the broker's router
serves (and so ApiVersions advertises): a user reads what to expect before trying."""
from __future__ import annotations

import re
from pathlib import Path

import semel.broker.handlers  # noqa: F401  (registers every handler)
from semel.broker.router import supported_versions

DOC = Path(__file__).resolve().parents[2] / "docs" / "api-support.md"
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\w+)\s*\|\s*(\d+)(?:-(\d+))?\s*\|")


def test_table_matches_the_router():
    rows = {}
    for line in DOC.read_text().splitlines():
        m = ROW.match(line)
        if m:
            lo = int(m.group(3))
            rows[int(m.group(1))] = (lo, int(m.group(4) or lo))
    assert rows == supported_versions()

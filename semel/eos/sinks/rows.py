"""Row checks the sinks share, run at stage time so that a bad row fails in the
cycle that staged it rather than in a later prepare."""
from __future__ import annotations

import json
from typing import Any, Collection


def encode_json_row(row: Any, sink: str) -> str:
    """One JSON line for `row` (compact, keys sorted, so the same row is the same text)."""
    try:
        return json.dumps(row, separators=(",", ":"), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{sink} sink rows must be JSON-serialisable: {exc}") from None


def check_columns(row: Any, columns: Collection[str], sink: str, holder: str) -> dict:
    """`row` as a dict of column values whose columns all exist in `holder` (the schema, the table)."""
    if not isinstance(row, dict):
        raise TypeError(f"{sink} sink rows are dicts of column values, got {type(row).__name__}")
    unknown = set(row) - set(columns)
    if unknown:
        raise ValueError(f"row has columns not in the {holder}: {sorted(unknown)}")
    return row

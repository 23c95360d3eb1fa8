"""Why a check run stopped without a verdict."""
from __future__ import annotations


class WorkloadError(RuntimeError):
    """The run could not be carried out (not an anomaly: the broker never let us start)."""

"""Lines about clients' bad input are capped per second, and what was left out is counted."""
from __future__ import annotations

import logging

from semel.broker.connection import _BadInputLog


def test_a_flood_of_bad_input_logs_a_bounded_number_of_lines(caplog):
    caplog.set_level(logging.WARNING, logger="semel.broker.conn")
    limited = _BadInputLog(per_second=5)
    for i in range(1000):
        limited.warning("closing %s: %s", f"peer{i}", "garbage")
    assert 1 <= len(caplog.records) <= 10    # 5 a second; the loop may straddle a second
    limited._window -= 1                      # the next second
    limited.warning("closing %s: %s", "late", "garbage")
    assert "similar lines left out" in caplog.records[-1].getMessage()

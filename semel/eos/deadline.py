"""A deadline on a blocking call that cannot be cancelled.

Client libraries do not always keep their own timeouts: librdkafka's
send_offsets_to_transaction can wait past its timeout for ever after a broker
restart (docs/librdkafka-restart-hang.md). The runtime therefore runs each
broker or sink call that may block in a daemon thread and stops waiting at a
deadline. A hung call cannot be cancelled in Python: its thread is left behind
(appended to `left_behind`), and the caller must treat the object it was
called on as unusable until that thread ends.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class DeadlineExceeded(Exception):
    """The call did not return in time; it may still be running."""


def call_with_deadline(fn: Callable[[], T], timeout: float | None,
                       left_behind: list[threading.Thread] | None = None, name: str = "semel-eos-call") -> T:
    """fn()'s value or exception, or DeadlineExceeded after `timeout` seconds
    (None: no deadline, fn runs in the calling thread)."""
    if timeout is None:
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            box["error"] = exc

    t = threading.Thread(target=target, name=name, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        if left_behind is not None:
            left_behind.append(t)
        raise DeadlineExceeded(f"timed out after {timeout:g}s")
    if "error" in box:
        raise box["error"]
    return box.get("value")

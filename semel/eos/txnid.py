"""Sink transaction ids: `{app_id}-{instance_id}-{cycle}`.

The id is the unit of recoverability. It is derived from stable names and the
cycle counter (which itself is recovered from the broker at start), so after a
restart the runtime can tell which prepared transactions are its own and which
broker transaction each belongs to.

Names may not contain '-', so the split back into parts is unambiguous, and
are limited to characters that are safe as file names, S3 keys, URL path
segments and PostgreSQL prepared-transaction identifiers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"^[A-Za-z0-9_.]{1,64}$")


def check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not _NAME.match(value) or value in (".", ".."):
        raise ValueError(
            f"{what} must be 1-64 characters of letters, digits, '_' or '.' (no '-'), got {value!r}")
    return value


@dataclass(frozen=True)
class SinkTxnId:
    app_id: str
    instance_id: str
    cycle: int

    def __post_init__(self) -> None:
        check_name("app_id", self.app_id)
        check_name("instance_id", self.instance_id)
        if not isinstance(self.cycle, int) or isinstance(self.cycle, bool) or self.cycle < 0:
            raise ValueError(f"cycle must be a non-negative int, got {self.cycle!r}")

    def __str__(self) -> str:
        return f"{self.app_id}-{self.instance_id}-{self.cycle}"

    @property
    def prefix(self) -> str:
        return f"{self.app_id}-{self.instance_id}-"

    @classmethod
    def parse(cls, text: str) -> "SinkTxnId":
        """Parse a txn id; ValueError with the offending text if it is not one."""
        if not isinstance(text, str):
            raise ValueError(f"txn id must be a string, got {type(text).__name__}")
        parts = text.split("-")
        if len(parts) != 3 or not parts[2].isdigit() or not parts[2].isascii():
            raise ValueError(f"not a sink txn id (want app-instance-cycle): {text!r}")
        return cls(parts[0], parts[1], int(parts[2]))


def owned_cycle(text: str, app_id: str, instance_id: str) -> int | None:
    """The cycle of `text` if it is a well-formed id of this app instance, else None."""
    try:
        tid = SinkTxnId.parse(text)
    except ValueError:
        return None
    if tid.app_id != app_id or tid.instance_id != instance_id:
        return None
    return tid.cycle


def is_owned_prefix(text: str, app_id: str, instance_id: str) -> bool:
    """True if `text` starts with this instance's prefix (even if malformed after it)."""
    return isinstance(text, str) and text.startswith(f"{app_id}-{instance_id}-")

"""Subscriptions by regular expression, evaluated by the coordinator with RE2 semantics
as Kafka's (the google-re2 binding, not Python's re)."""
from __future__ import annotations

import functools
from typing import Protocol

import re2


class _Pattern(Protocol):
    """What is used of a compiled google-re2 pattern (the binding ships no types)."""

    def fullmatch(self, text: str) -> object | None: ...


@functools.lru_cache(maxsize=4096)
def _compiled(regex: str) -> _Pattern:
    pattern: _Pattern = re2.compile(regex)
    return pattern


def regex_matches(regex: str, topic: str) -> bool:
    """Kafka's rule: the whole topic name matches, with RE2 semantics."""
    return _compiled(regex).fullmatch(topic) is not None


def regex_error(regex: str) -> str | None:
    try:
        _compiled(regex)
    except re2.error as exc:
        return str(exc)
    return None

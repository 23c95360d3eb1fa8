"""A handler's answer that is not ready yet.

Its own module because both the connection (which awaits it in request order) and
the handler wrappers of broker/auth (which merge denied entries into it) need it,
and the connection imports those wrappers.
"""
from __future__ import annotations

from typing import Any, Awaitable


class Deferred:
    """A response that is ready once `awaitable` finishes (it returns the body)."""
    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[Any]):
        self.awaitable = awaitable

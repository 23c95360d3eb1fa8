"""Wake long-polling fetches when data is appended (or a transaction completes)."""
from __future__ import annotations

import asyncio


class AppendNotifier:
    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], set[asyncio.Future[None]]] = {}

    def notify(self, topic: str, partition: int) -> None:
        for fut in self._waiters.pop((topic, partition), ()):
            if not fut.done():
                fut.set_result(None)

    async def wait_any(self, keys: list[tuple[str, int]], timeout_s: float) -> None:
        """Return when any of `keys` is appended to, or after `timeout_s`.

        Always yields to the event loop at least once, so a caller that loops on it
        can never hold the loop, whatever it passes (no keys, no time left).
        """
        if timeout_s <= 0 or not keys:
            await asyncio.sleep(0)
            return
        fut = asyncio.get_running_loop().create_future()
        for key in keys:
            self._waiters.setdefault(key, set()).add(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            for key in keys:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(fut)
                    if not waiters:
                        del self._waiters[key]

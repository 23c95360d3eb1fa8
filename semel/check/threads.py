"""Blocking calls (admin requests, broker restarts) awaited from the check's event loop."""
from __future__ import annotations

import asyncio
import threading


async def blocking(fn, *args):
    """Run a blocking call in a daemon thread. Unlike asyncio.to_thread, an
    interrupted run does not wait for it (a hung broker can make admin calls
    and restarts take a minute); the process exits around it."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def deliver(setter, value):
        if not fut.done():
            setter(value)

    def runner():
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting coroutine
            outcome = (fut.set_exception, exc)
        else:
            outcome = (fut.set_result, result)
        try:
            loop.call_soon_threadsafe(deliver, *outcome)
        except RuntimeError:
            pass  # the loop is gone: nobody is waiting any more

    threading.Thread(target=runner, daemon=True, name="check-blocking").start()
    return await fut

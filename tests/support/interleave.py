"""Seeded scheduling for model tests that run requests as asyncio tasks."""
from __future__ import annotations

import asyncio
import random


async def let_tasks_run(rng: random.Random, tasks, waits: list[float], max_yields: int) -> None:
    """Give the tasks in flight a seeded slice of the loop: half the time wait on them for
    one of `waits` seconds (some finish, some not), else yield 0..max_yields times. The
    draws from `rng` are the same for a seed, so a failing seed replays its order."""
    if tasks and rng.random() < 0.5:
        await asyncio.wait(set(tasks), timeout=rng.choice(waits))
    else:
        for _ in range(rng.randint(0, max_yields)):
            await asyncio.sleep(0)

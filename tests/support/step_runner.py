"""A stand-in for the worker threads a PartitionLog hands file work to (its `runner`),
under the test's control: a submitted job runs only when the test releases it, or when
someone waits for its result, as a real thread that had not started yet would be
waited for. So a model test decides, step by step, when each write, roll or
checkpoint lands relative to the loop's own steps, and a seed replays the same order.
"""
from __future__ import annotations

import random
from concurrent.futures import Future


class _Job(Future):
    """A Future whose work runs at release() or at the first result()/exception()."""

    def __init__(self, runner: "StepRunner", fn, args, kwargs):
        super().__init__()
        self.runner, self.fn, self.args, self.kwargs = runner, fn, args, kwargs
        self.waited = False      # someone waited for it before the test released it

    def result(self, timeout=None):
        self._forced()
        return super().result(timeout)

    def exception(self, timeout=None):
        self._forced()
        return super().exception(timeout)

    def _forced(self) -> None:
        if not self.done():
            self.waited = True
            self.runner.release(self)

    def _run(self) -> None:
        if not self.set_running_or_notify_cancel():
            return
        try:
            value = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:      # the job's own error goes to its waiter, as in a pool
            self.set_exception(exc)
        else:
            self.set_result(value)


class StepRunner:
    """submit() queues; release(job) / release_random(rng) / release_all() run queued jobs
    in the calling thread. `ran` lists every job in the order it ran."""

    def __init__(self) -> None:
        self.queued: list[_Job] = []
        self.ran: list[_Job] = []

    def submit(self, fn, /, *args, **kwargs) -> Future:
        job = _Job(self, fn, args, kwargs)
        self.queued.append(job)
        return job

    def release(self, job: _Job) -> None:
        if job in self.queued:
            self.queued.remove(job)
            self.ran.append(job)
            job._run()

    def release_random(self, rng: random.Random) -> _Job | None:
        if not self.queued:
            return None
        job = self.queued[rng.randrange(len(self.queued))]
        self.release(job)
        return job

    def release_all(self) -> None:
        while self.queued:
            self.release(self.queued[0])

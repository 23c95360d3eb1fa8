"""Per-API request latency, split by stage (Kafka's RequestMetrics are the model).

Where one request's time goes, as the connection sees it (semel.broker.connection):

- request_queue: its frame was read, earlier frames of the same read were handled first;
- local: the handler ran until its answer was decided (for an acks=all Produce: the
  appends are written and the answer waits only for the commit point; a write-through
  append of one large batch is fsynced by the thread that writes it, so that fsync
  counts here);
- response_queue: the answer waited for earlier answers of the connection (Kafka
  answers a connection's requests in order);
- remote: the writer waited for the commit point (fsync rounds, followers' fetches)
  that had not passed while the answer queued; zero for an answer ready at once;
- send: encoding the response and handing it to the socket.

`total` is their sum, from the frame read to the response written:
semel_request_seconds{api}. The stages are semel_request_stage_seconds{api,stage}.

Only a handler that hands its wait to the connection (a Deferred: acks=all Produce,
JoinGroup/SyncGroup waiting for the rebalance) has a remote stage. Handlers that wait
inside themselves count the wait as local: the coordinators' requests (EndTxn,
AddPartitionsToTxn, TxnOffsetCommit, OffsetCommit...) append to their internal log
and wait for its commit point there, and a Fetch's long poll waits there.

Both are plain lists counted on the event loop and turned into histograms at scrape
time: a prometheus_client Histogram takes a lock and walks its buckets per observe,
and every request observes six values here. Counts are read as copies in the scrape
thread; a histogram's count is the sum of its buckets, so the two always agree.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Iterator

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

STAGES = ("request_queue", "local", "response_queue", "remote", "send")
# Upper bounds (seconds): 50 us to 10 s, finer where single-node latency lives.
BUCKETS = (.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1.0, 2.5, 10.0)


class ApiTimes:
    """The counts of one API: per stage and for the total, a count per bucket (the last
    one +Inf) and a sum."""
    __slots__ = ("counts", "sums")

    def __init__(self) -> None:
        self.counts = [[0] * (len(BUCKETS) + 1) for _ in range(len(STAGES) + 1)]
        self.sums = [0.0] * (len(STAGES) + 1)

    def observe(self, *stages: float) -> None:
        """One request's seconds in each of STAGES, in order; their sum is its total."""
        counts, sums = self.counts, self.sums
        total = 0.0
        for i, t in enumerate(stages):
            counts[i][bisect_left(BUCKETS, t)] += 1
            sums[i] += t
            total += t
        counts[-1][bisect_left(BUCKETS, total)] += 1
        sums[-1] += total


class RequestTimes(Collector):
    """semel_request_seconds{api} and semel_request_stage_seconds{api,stage}."""

    def __init__(self) -> None:
        self._apis: dict[str, ApiTimes] = {}

    def api(self, name: str) -> ApiTimes:
        times = self._apis.get(name)
        if times is None:
            times = self._apis[name] = ApiTimes()
        return times

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        total = HistogramMetricFamily("semel_request_seconds", "Request latency: frame read to response "
                                      "written", labels=["api"])
        stage = HistogramMetricFamily("semel_request_stage_seconds", "Request latency by stage (request_queue, "
                                      "local, response_queue, remote, send)", labels=["api", "stage"])
        for name, times in list(self._apis.items()):
            for i, counts in enumerate(times.counts):
                buckets, sum_s = _cumulative(list(counts)), times.sums[i]
                if i == len(STAGES):
                    total.add_metric([name], buckets, sum_s)
                else:
                    stage.add_metric([name, STAGES[i]], buckets, sum_s)
        yield total
        yield stage


def _cumulative(counts: list[int]) -> list[tuple[str, float]]:
    out, running = [], 0
    for bound, n in zip((*(repr(b) for b in BUCKETS), "+Inf"), counts):
        running += n
        out.append((bound, float(running)))
    return out

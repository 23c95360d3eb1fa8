"""Brokers' views of one real etcd, for tests of the cluster metadata: each call runs
under a new cluster id, so one etcd process serves a whole module."""
from __future__ import annotations

import asyncio
import itertools

from semel.cluster.etcd import Etcd
from semel.cluster.metadata import EtcdClusterView
from semel.cluster.state import BrokerInfo

_ids = itertools.count()


def run_views(etcd, prefix, nodes, body, *, ttl=6, all_registered=False):
    """body(views) on fresh started views of `nodes`; every view is stopped after.
    With all_registered, the body starts once each view sees every broker's registration."""
    cluster_id = f"{prefix}-{next(_ids)}"

    async def go():
        views = [EtcdClusterView(Etcd(etcd.endpoint), cluster_id, n, BrokerInfo(n, "127.0.0.1", 9000 + n), ttl)
                 for n in nodes]
        for v in views:
            await v.start()
        try:
            while all_registered and any(len(v.brokers()) < len(nodes) for v in views):
                await asyncio.sleep(0.05)
            return await body(views)
        finally:
            for v in views:
                await v.stop()
    return asyncio.run(go())

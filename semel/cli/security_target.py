"""Where `semel user` and `semel acl` keep what they change: a single node's data dir
(files the broker re-reads) or a cluster's etcd (every broker follows it)."""
from __future__ import annotations

import asyncio
from pathlib import Path

from ..cluster.keys import DEFAULT_CLUSTER_ID
from .main import CliError


def add_target_args(sp) -> None:
    where = sp.add_mutually_exclusive_group(required=True)
    where.add_argument("--data-dir", type=Path, help="a single node's data directory")
    where.add_argument("--metadata", metavar="ENDPOINTS",
                       help="a cluster's etcd endpoints (users and ACLs of every broker)")
    sp.add_argument("--cluster-id", default=DEFAULT_CLUSTER_ID, help="the cluster's name (with --metadata)")


def check_data_dir(args) -> None:
    if not args.data_dir.is_dir():
        raise CliError(f"no data directory at {args.data_dir}")


def on_cluster(args, work) -> object:
    """Run `await work(EtcdSecurity)` against the cluster's etcd; one line if unreachable."""
    from .optional import require
    require("aiohttp", "--metadata (a cluster's users and ACLs)")
    from ..cluster.etcd import Etcd, EtcdError, parse_endpoints
    from ..broker.auth.cluster_store import EtcdSecurity
    try:
        endpoints = parse_endpoints(args.metadata)
    except ValueError as exc:
        raise CliError(str(exc)) from None

    async def run():
        sec = EtcdSecurity(Etcd(endpoints), args.cluster_id)
        try:
            return await work(sec)
        finally:
            await sec.etcd.close()
    try:
        return asyncio.run(run())
    except EtcdError as exc:
        raise CliError(f"etcd at {args.metadata}: {exc}") from None

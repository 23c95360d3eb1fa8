"""What the subcommands that talk to one broker share: the --bootstrap option and
running an action on a connected client, with client errors as one CLI line."""
from __future__ import annotations

from ..client import Client, ClientError
from .main import CliError


def add_bootstrap(parsers, run) -> None:
    for sp in parsers:
        sp.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT of a broker")
        sp.set_defaults(func=run)


def run_action(args, actions: dict) -> int:
    """actions[args.action](client, args) on a connection to args.bootstrap."""
    try:
        with Client(args.bootstrap) as client:
            return actions[args.action](client, args)
    except ClientError as exc:
        raise CliError(str(exc)) from None

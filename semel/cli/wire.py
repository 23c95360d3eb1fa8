"""What the subcommands that talk to one broker share: the --bootstrap and SASL
options, and running an action on a connected (and logged-in) client, with client
errors as one CLI line."""
from __future__ import annotations

import os

from ..client import Client, ClientError
from .main import CliError


def add_bootstrap(parsers, run) -> None:
    for sp in parsers:
        sp.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT of a broker")
        sp.add_argument("--sasl-mechanism", choices=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"], default=None,
                        help="log in on a SASL_PLAINTEXT listener")
        sp.add_argument("--sasl-username", default=None)
        sp.add_argument("--sasl-password-env", default="SEMEL_SASL_PASSWORD", metavar="VAR",
                        help="environment variable holding the password (default SEMEL_SASL_PASSWORD)")
        sp.set_defaults(func=run)


def run_action(args, actions: dict) -> int:
    """actions[args.action](client, args) on a connection to args.bootstrap."""
    try:
        with Client(args.bootstrap) as client:
            _login(client, args)
            return actions[args.action](client, args)
    except ClientError as exc:
        raise CliError(str(exc)) from None


def _login(client: Client, args) -> None:
    if args.sasl_mechanism is None:
        return
    password = os.environ.get(args.sasl_password_env)
    if not args.sasl_username or password is None:
        raise CliError(f"--sasl-mechanism needs --sasl-username and the password in ${args.sasl_password_env}")
    from ..client.sasl import authenticate
    authenticate(client, args.sasl_mechanism, args.sasl_username, password)

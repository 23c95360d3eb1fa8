"""What the subcommands that talk to brokers over the wire share: the --bootstrap, TLS
and SASL options, and running an action on a Route from a connected (and logged-in)
client, with client errors as one CLI line."""
from __future__ import annotations

import os

from ..client import Client, ClientError
from .main import CliError
from .route import Route


def add_bootstrap(parsers, run) -> None:
    for sp in parsers:
        sp.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT of a broker")
        sp.add_argument("--ssl", action="store_true", help="connect with TLS (an SSL or SASL_SSL listener)")
        sp.add_argument("--ssl-cafile", default=None,
                        help="PEM CA the broker's certificate must chain to (default: the system's CAs); implies --ssl")
        sp.add_argument("--ssl-certfile", default=None, help="client certificate (PEM) for mTLS; implies --ssl")
        sp.add_argument("--ssl-keyfile", default=None, help="its private key (PEM)")
        sp.add_argument("--sasl-mechanism", choices=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"], default=None,
                        help="log in on a SASL listener (SASL_SSL with --ssl)")
        sp.add_argument("--sasl-username", default=None)
        sp.add_argument("--sasl-password-env", default="SEMEL_SASL_PASSWORD", metavar="VAR",
                        help="environment variable holding the password (default SEMEL_SASL_PASSWORD)")
        sp.set_defaults(func=run)


def run_action(args, actions: dict) -> int:
    """actions[args.action](route, args): a Route (semel.cli.route) from a connection to
    args.bootstrap, since a command's requests go to the brokers that hold what it names."""
    connect = connector(args)
    try:
        with connect(args.bootstrap) as client:
            route = Route(connect, client)
            try:
                return actions[args.action](route, args)
            finally:
                route.close()
    except ClientError as exc:
        raise CliError(str(exc)) from None


def connector(args, timeout_s: float = 30.0):
    """A function HOST:PORT -> Client, connected with the flags' TLS and logged in with
    their SASL settings (for commands that talk to every broker of a cluster)."""
    ctx = tls_context(args)
    _credentials(args)   # missing ones fail here, before any connection is tried

    def connect(address: str) -> Client:
        client = Client(address, timeout_s=timeout_s, ssl_context=ctx)
        try:
            _login(client, args)
        except BaseException:
            client.close()
            raise
        return client
    return connect


def tls_context(args):
    """The client's TLS settings from the flags; None without any of them."""
    if not (args.ssl or args.ssl_cafile or args.ssl_certfile):
        return None
    import ssl
    try:
        ctx = ssl.create_default_context(cafile=args.ssl_cafile)
        if args.ssl_certfile:
            ctx.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
    except (OSError, ssl.SSLError) as exc:
        what = f"--ssl-cafile {args.ssl_cafile}" if args.ssl_cafile else f"--ssl-certfile {args.ssl_certfile}"
        raise CliError(f"cannot load {what}: {getattr(exc, 'strerror', None) or exc}") from None
    return ctx


def _credentials(args) -> str | None:
    """The SASL password the flags name (None without --sasl-mechanism)."""
    if args.sasl_mechanism is None:
        return None
    password = os.environ.get(args.sasl_password_env)
    if not args.sasl_username or password is None:
        raise CliError(f"--sasl-mechanism needs --sasl-username and the password in ${args.sasl_password_env}")
    return password


def _login(client: Client, args) -> None:
    password = _credentials(args)
    if password is None:
        return
    from ..client.sasl import authenticate
    authenticate(client, args.sasl_mechanism, args.sasl_username, password)

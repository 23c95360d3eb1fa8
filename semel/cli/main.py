"""`semel` entry point: one subcommand module each, registered here.

A subcommand module imports what its run() needs inside the functions that need it:
building the parser imports every subcommand module, and `semel produce` should load
neither the broker, nor the checker, nor an extra it does not use."""
from __future__ import annotations

import argparse
import importlib
import sys

# name -> module under semel.cli that defines add_parser(subparsers) and run(args)
SUBCOMMANDS = {
    "broker": "broker",
    "topic": "topic",
    "produce": "produce",
    "consume": "consume",
    "demo": "demo",
    "check": "check",
    "bench": "bench",
    "txn": "txn",
    "group": "group",
    "user": "user",
    "acl": "acl",
    "cluster": "cluster",
    "console": "console",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="semel", description="exactly-once streaming over the Kafka protocol")
    parser.add_argument("--version", action=_Version, nargs=0, help="show the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, modname in SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(f"semel.cli.{modname}")
        except ModuleNotFoundError as exc:
            if exc.name != f"semel.cli.{modname}":
                raise
            continue
        mod.add_parser(sub)
    return parser


class _Version(argparse.Action):
    """--version, looked up only when asked: reading the installed metadata scans every
    distribution on the path (0.1-0.2 s on a loaded box), which every broker start (a
    test fixture's too) would otherwise pay."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"semel {installed_version()}")
        parser.exit()


def installed_version() -> str:
    """The installed distribution's version (pyproject.toml's), or "unknown" when semel
    runs from a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("semel")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except CliError as exc:
        print(f"semel {args.command}: {exc}", file=sys.stderr)
        return 2


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status 2."""


def require_broker(bootstrap: str) -> None:
    """Fail with one readable line before handing the address to librdkafka,
    which would otherwise retry (and log) for as long as its timeouts allow."""
    from ..client import Client, ClientError
    try:
        Client(bootstrap, timeout_s=5).close()
    except (ClientError, OSError) as exc:
        raise CliError(str(exc)) from None


if __name__ == "__main__":
    # Run through the imported module so that CliError raised by subcommands
    # is the same class main() catches (not a second copy living in __main__).
    from semel.cli.main import main as _main
    sys.exit(_main())

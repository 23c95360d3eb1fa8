"""`semel` entry point: one subcommand module each, registered here."""
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
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="semel", description="exactly-once streaming over the Kafka protocol")
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


if __name__ == "__main__":
    sys.exit(main())

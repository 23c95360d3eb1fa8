"""`semel user add|list|delete`: SCRAM credentials in the broker's data dir. A
running broker re-reads the file on the next login, so no restart is needed."""
from __future__ import annotations

import getpass
import os
from pathlib import Path

from .main import CliError


def add_parser(sub) -> None:
    p = sub.add_parser("user", help="manage SASL users (stored as SCRAM salted hashes)")
    usub = p.add_subparsers(dest="action", metavar="ACTION")
    usub.required = True
    a = usub.add_parser("add", help="add a user or change its password")
    a.add_argument("name")
    a.add_argument("--password-env", default=None, metavar="VAR",
                   help="read the password from this environment variable (default: prompt)")
    a.add_argument("--mechanism", action="append", default=None,
                   choices=["SCRAM-SHA-256", "SCRAM-SHA-512"], help="credential kinds to store (default both)")
    lst = usub.add_parser("list", help="list users and their SCRAM mechanisms")
    d = usub.add_parser("delete", help="delete a user")
    d.add_argument("name")
    for sp in (a, lst, d):
        sp.add_argument("--data-dir", required=True, type=Path, help="the broker's data directory")
        sp.set_defaults(func=run)


def run(args) -> int:
    from ..broker.auth.users import MECHANISMS, UserStore
    if not args.data_dir.is_dir():
        raise CliError(f"no data directory at {args.data_dir}")
    users = UserStore(args.data_dir)
    try:
        if args.action == "add":
            password = _password(args)
            users.add(args.name, password, tuple(args.mechanism or MECHANISMS))
            print(f"user {args.name} saved")
        elif args.action == "delete":
            if not users.delete(args.name):
                raise CliError(f"no user {args.name!r}")
            print(f"user {args.name} deleted")
        else:
            for name, mechs in users.names().items():
                print(f"{name}\t{','.join(mechs)}")
    except (ValueError, OSError) as exc:
        raise CliError(str(exc)) from None
    return 0


def _password(args) -> str:
    if args.password_env:
        value = os.environ.get(args.password_env)
        if not value:
            raise CliError(f"environment variable {args.password_env} is empty or unset")
        return value
    return getpass.getpass(f"password for {args.name}: ")

"""`semel user add|list|delete`: SCRAM credentials in a single node's data dir (the
broker re-reads the file on the next login) or, with --metadata, in a cluster's etcd
(every broker follows it). No restart is needed either way."""
from __future__ import annotations

import getpass
import os

from .main import CliError
from .security_target import add_target_args, check_data_dir, on_cluster


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
        add_target_args(sp)
        sp.set_defaults(func=run)


def run(args) -> int:
    from ..broker.auth.users import MECHANISMS, UserStore
    if args.metadata is not None:
        return _run_cluster(args)
    check_data_dir(args)
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


def _run_cluster(args) -> int:
    from ..broker.auth.users import MECHANISMS
    if args.action == "add":
        password = _password(args)
        try:
            on_cluster(args, lambda sec: sec.put_user(args.name, password, tuple(args.mechanism or MECHANISMS)))
        except ValueError as exc:
            raise CliError(str(exc)) from None
        print(f"user {args.name} saved")
    elif args.action == "delete":
        if not on_cluster(args, lambda sec: sec.delete_user(args.name)):
            raise CliError(f"no user {args.name!r}")
        print(f"user {args.name} deleted")
    else:
        for name, creds in sorted(on_cluster(args, lambda sec: sec.users()).items()):
            print(f"{name}\t{','.join(sorted(creds))}")
    return 0


def _password(args) -> str:
    if args.password_env:
        value = os.environ.get(args.password_env)
        if not value:
            raise CliError(f"environment variable {args.password_env} is empty or unset")
        return value
    return getpass.getpass(f"password for {args.name}: ")

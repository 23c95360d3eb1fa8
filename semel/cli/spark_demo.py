"""`semel demo` (the default): the embedded broker and PostgreSQL around semel.demo's crash loop."""
from __future__ import annotations

import contextlib
import shutil
import tempfile
import warnings
from pathlib import Path

from rich.console import Console

from ..launch.process import SemelBroker
from .main import CliError


@contextlib.contextmanager
def embedded_postgres(root: Path):
    """A pgserver instance under root, stopped afterwards (table mode needs no prepared transactions)."""
    pgserver = import_pgserver()
    srv = pgserver.get_server(root / "pg", cleanup_mode="stop")
    try:
        yield srv.get_uri()
    finally:
        srv.cleanup()


def import_pgserver():
    """pgserver, imported without a RuntimeDirWarning on the demo's first lines. pgserver
    asks platformdirs for the user's runtime directory at import (for its lock file);
    where XDG_RUNTIME_DIR is unset or unusable (a root shell, a container, CI) platformdirs
    warns and falls back to /run/user/<uid> or a private directory under /tmp, either of
    which serves that lock as well."""
    import platformdirs
    category = getattr(platformdirs, "RuntimeDirWarning", None)   # older platformdirs: no such warning
    with warnings.catch_warnings():
        if category is not None:
            warnings.simplefilter("ignore", category)
        import pgserver
    return pgserver


def run_spark_demo(args) -> int:
    from semel.demo import run as demo
    records = 3000 if args.records is None else args.records
    if records < 1 or args.crashes < 0 or args.rate <= 0:
        raise CliError("--records must be at least 1, --crashes at least 0, --rate above 0")
    console = Console()
    work = args.data_dir or Path(tempfile.mkdtemp(prefix="semel-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap
        if bootstrap is None:
            broker = stack.enter_context(SemelBroker(work / "broker", log_path=work / "broker.log"))
            bootstrap = broker.bootstrap
        postgres = args.postgres or stack.enter_context(embedded_postgres(work))
        console.print(f"[bold]semel demo[/]: broker {bootstrap}, Spark {args.master}, work dir {work}")
        cfg = demo.Config(bootstrap=bootstrap, postgres=postgres, work=work, records=records,
                          crashes=args.crashes, rate=args.rate, seed=args.seed, master=args.master)
        try:
            demo.prepare(cfg)
        except Exception as e:  # noqa: BLE001 - one line for an unreachable broker or database
            raise CliError(f"cannot prepare the demo: {e}") from None
        outcome = demo.crash_loop(cfg, console)
        demo.report(cfg, outcome, console)
    if outcome.ok(cfg):
        console.print(f"[green]every input reached every output exactly once across {outcome.crashes} "
                      "crashes[/]")
        if args.data_dir is None:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    console.print(f"[red]anomaly: see the table above (processor logs under {work})[/]")
    return 1

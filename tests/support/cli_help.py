"""`semel <command> --help` for many commands in one Python process.

Each `python -m semel ... --help` pays the interpreter start and the import of
every subcommand module (about a second on a loaded CI box); one process that
calls semel.cli.main.main once per command checks the same parsers."""
from __future__ import annotations

import json

_LOOP = """
import contextlib, io, json
from semel.cli.main import main
results = []
for argv in {commands!r}:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            code = main(argv)
    except SystemExit as exc:
        code = exc.code
    results.append([argv, code, out.getvalue()])
print(json.dumps(results))
"""


def help_code(commands: list[list[str]]) -> str:
    """Python source that runs main(argv) for each argv and prints [[argv, exit code, stdout], ...] as JSON."""
    return _LOOP.format(commands=commands)


def check_helps(stdout: str, stderr: str, commands: list[list[str]]) -> None:
    """Every command of help_code's run exited 0 and printed its usage."""
    results = json.loads(stdout)
    assert [argv for argv, _, _ in results] == commands
    for argv, code, out in results:
        assert code == 0, (argv, stderr)
        assert "usage:" in out, (argv, out)

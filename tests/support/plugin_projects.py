"""Run an outside project's test file (tests/plugin/projects/) with pytest in a
process of its own, in a folder of its own: only the installed plugin, none of the
suite's conftest or helpers."""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path


PROJECTS = Path(__file__).resolve().parent.parent / "plugin" / "projects"
PLUGIN = "semel.testing.pytest_plugin"


def plugin_args() -> list[str]:
    """Nothing where the `pytest11` entry point is installed (pytest finds the plugin
    itself); else `-p` the module, for a checkout whose install predates the entry point."""
    if any(ep.value == PLUGIN for ep in entry_points(group="pytest11")):
        return []
    return ["-p", PLUGIN]


@dataclass
class Outcome:
    returncode: int
    output: str
    results: dict[str, str]   # test name -> passed | failed | error | skipped

    def passed(self) -> set[str]:
        return {name for name, r in self.results.items() if r == "passed"}


def outcomes(junit: Path) -> dict[str, str]:
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        out[case.get("name")] = {"failure": "failed"}.get(kinds[0], kinds[0]) if kinds else "passed"
    return out


def run_project(folder: Path, files: dict[str, str], *args: str, timeout_s: float = 240,
                python: str = sys.executable, env: dict | None = None) -> Outcome:
    """Copy projects/<source> to folder/<name> for each name -> source, run pytest there
    with `python` (another environment's: semel installed there, so its entry point)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        (folder / name).write_text((PROJECTS / source).read_text())
    junit = folder / "junit.xml"
    plugin = plugin_args() if python == sys.executable else []
    r = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", *plugin, f"--junitxml={junit}",
                        "-W", "ignore::DeprecationWarning", *args], cwd=folder, capture_output=True, text=True,
                       timeout=timeout_s, env=dict(os.environ, **(env or {})))
    return Outcome(r.returncode, r.stdout + r.stderr, outcomes(junit) if junit.exists() else {})

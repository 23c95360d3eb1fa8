"""The operator console as its users meet it: `semel console` started as a process,
and Debian's chromium (headless) driven by Playwright against it.

Screenshots go to the test's temp folder; with SEMEL_CONSOLE_SCREENSHOTS=DIR set
(docs/console to refresh the documentation's pictures) they go there too."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from semel.launch.process import free_port

from .wait import until

CHROMIUM = "/usr/bin/chromium"


@contextmanager
def console_process(bootstrap: str, log: Path, *extra: str, env: dict | None = None):
    """`semel console` on a free local port; yields its base URL once it answers.
    env: variables added to its environment (a SASL password)."""
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "semel", "console", "--bootstrap", bootstrap,
                                 "--port", str(port), "--interval", "0.5", *extra],
                                stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})))
    url = f"http://127.0.0.1:{port}"
    try:
        until(lambda: _answers(url) or proc.poll() is not None, "the console answers", 60)
        assert proc.poll() is None, f"semel console exited: {log.read_text()}"
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/brokers", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def get(url: str, path: str) -> str:
    with urllib.request.urlopen(url + path, timeout=30) as resp:
        return resp.read().decode()


def post(url: str, path: str, fields: dict, headers: dict | None = None) -> tuple[int, str]:
    """A form POST (as a plain HTML form sends it, unless headers add more): (status, body)."""
    data = urllib.parse.urlencode(fields).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, data=data, headers=headers or {}),
                                    timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@contextmanager
def browser_page():
    """One headless chromium page (Playwright's own browser download is not used)."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(30_000)
            yield page
        finally:
            browser.close()


def screenshot(page, tmp: Path, name: str) -> Path:
    path = tmp / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    target = os.environ.get("SEMEL_CONSOLE_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)
    return path

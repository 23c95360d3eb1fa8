"""Reference server for the HTTP two-phase-commit protocol.

    POST /prepare/{txn}   body: JSON array of rows   -> 200 | 409 (already prepared or committed
                                                                   with other, non-empty rows)
    POST /commit/{txn}                               -> 200 | 409 (not prepared)
    POST /abort/{txn}                                -> 200 | 409 (already committed)
    GET  /pending                                    -> 200 JSON array of prepared txn ids
    GET  /committed                                  -> 200 JSON object {txn: rows} (for readers/tests)

Every operation is idempotent: repeating it answers 200 (a repeated prepare
must carry the same rows). Bad requests get 400 with a JSON error, unknown
paths 404. With a data directory, state survives restarts of the server
(each batch file is written to a temp name, fsynced and renamed).

Run standalone: python -m semel.eos.sinks.http_server --port 8080 [--data-dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from semel.eos.sinks.fsync import fsync_dir

_TXN = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
MAX_BODY = 64 * 1024 * 1024


class Conflict(Exception):
    pass


class BatchStore:
    """prepared/committed batches, in memory and optionally on disk."""

    def __init__(self, data_dir: str | Path | None = None):
        self.lock = threading.Lock()
        self.prepared: dict[str, bytes] = {}
        self.committed: dict[str, bytes] = {}
        self.dir = Path(data_dir) if data_dir else None
        if self.dir:
            for sub in ("prepared", "committed"):
                (self.dir / sub).mkdir(parents=True, exist_ok=True)
                for f in (self.dir / sub).iterdir():
                    if f.suffix == ".json" and not f.name.startswith("."):
                        getattr(self, sub)[f.stem] = f.read_bytes()

    def prepare(self, txn: str, body: bytes) -> None:
        with self.lock:
            done = self.prepared.get(txn, self.committed.get(txn))
            if done is not None:
                # Same rows (a retry after a lost answer) or none (a repeat
                # from a process that has nothing staged) is a repeat: OK.
                if done != body and body != b"[]":
                    raise Conflict(f"{txn} is already prepared with other rows")
                return
            self._write("prepared", txn, body)
            self.prepared[txn] = body

    def commit(self, txn: str) -> None:
        with self.lock:
            if txn in self.committed:
                return
            if txn not in self.prepared:
                raise Conflict(f"{txn} is not prepared")
            if self.dir:
                os.rename(self.dir / "prepared" / f"{txn}.json", self.dir / "committed" / f"{txn}.json")
                fsync_dir(self.dir / "committed")
            self.committed[txn] = self.prepared.pop(txn)

    def abort(self, txn: str) -> None:
        with self.lock:
            if txn in self.committed:
                raise Conflict(f"{txn} is already committed")
            if self.prepared.pop(txn, None) is not None and self.dir:
                (self.dir / "prepared" / f"{txn}.json").unlink(missing_ok=True)
                fsync_dir(self.dir / "prepared")

    def _write(self, sub: str, txn: str, body: bytes) -> None:
        if not self.dir:
            return
        tmp = self.dir / sub / f".{txn}.tmp"
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, self.dir / sub / f"{txn}.json")
        fsync_dir(self.dir / sub)


class _Handler(BaseHTTPRequestHandler):
    server_version = "semel-2pc-reference/1"
    store: BatchStore  # set on the subclass made per server

    def log_message(self, fmt, *args):  # quiet: tests and benchmarks hammer it
        pass

    def _send(self, status: int, payload) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/pending":
            with self.store.lock:
                return self._send(200, sorted(self.store.prepared))
        if self.path == "/committed":
            with self.store.lock:
                return self._send(200, {t: json.loads(b) for t, b in self.store.committed.items()})
        self._send(404, {"error": f"no such resource {self.path}"})

    def do_POST(self):
        parts = self.path.strip("/").split("/")
        if len(parts) != 2 or parts[0] not in ("prepare", "commit", "abort"):
            return self._send(404, {"error": f"no such resource {self.path}"})
        op, txn = parts
        if not _TXN.match(txn):
            return self._send(400, {"error": f"bad txn id {txn!r}"})
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return self._send(400, {"error": "bad Content-Length"})
        if length < 0 or length > MAX_BODY:
            return self._send(400, {"error": f"body must be 0..{MAX_BODY} bytes"})
        body = self.rfile.read(length) if length else b""
        try:
            if op == "prepare":
                rows = json.loads(body or b"null")
                if not isinstance(rows, list):
                    return self._send(400, {"error": "prepare body must be a JSON array of rows"})
                self.store.prepare(txn, json.dumps(rows, separators=(",", ":")).encode())
            elif op == "commit":
                self.store.commit(txn)
            else:
                self.store.abort(txn)
        except json.JSONDecodeError as exc:
            return self._send(400, {"error": f"body is not JSON: {exc}"})
        except Conflict as exc:
            return self._send(409, {"error": str(exc)})
        self._send(200, {"ok": True})


class ReferenceServer:
    """The reference server on a loopback port, in a background thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, data_dir: str | Path | None = None):
        self.store = BatchStore(data_dir)
        handler = type("Handler", (_Handler,), {"store": self.store})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "ReferenceServer":
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), name="semel-2pc-ref",
                                       daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args(argv)
    server = ReferenceServer(args.host, args.port, args.data_dir)
    print(f"listening on {server.url}", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

"""HTTP two-phase-commit sink: the client side of the protocol in `http_server`.

    prepare  POST {base}/prepare/{txn}  body: JSON array of the batch's rows
    commit   POST {base}/commit/{txn}
    abort    POST {base}/abort/{txn}
    recover  GET  {base}/pending        -> JSON array of txn ids

Status mapping: 2xx OK; 409 (conflict: the server refuses, e.g. committing
what is not prepared) Fatal; 429 and 5xx Retryable; other 4xx Fatal (the
client speaks the protocol wrong); network errors Retryable.
"""
from __future__ import annotations

import http.client
import json
from typing import Any, Sequence
from urllib.parse import quote, urlsplit

from semel.eos.outcomes import OK, Fatal, Retryable, SinkOutcome
from semel.eos.sink import TwoPhaseSink
from semel.eos.sinks.rows import encode_json_row


class HttpSink(TwoPhaseSink):
    def __init__(self, base_url: str, name: str = "http", timeout: float | None = 30.0,
                 headers: dict[str, str] | None = None):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        self.name = name
        self.timeout = timeout
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        self.prefix = parts.path.rstrip("/")
        self.headers = dict(headers or {})
        self.staged: list[Any] = []

    def stage(self, row: Any) -> None:
        encode_json_row(row, "http")
        self.staged.append(row)

    def prepare(self, txn_id: str, rows: Sequence[Any] = ()) -> SinkOutcome:
        body = json.dumps(self.staged + list(rows), separators=(",", ":")).encode()
        outcome = self._outcome(*self._request("POST", f"/prepare/{quote(txn_id, safe='')}", body))
        if outcome is OK:
            self.staged = []
        return outcome

    def commit(self, txn_id: str) -> SinkOutcome:
        return self._outcome(*self._request("POST", f"/commit/{quote(txn_id, safe='')}"))

    def abort(self, txn_id: str) -> SinkOutcome:
        self.staged = []
        return self._outcome(*self._request("POST", f"/abort/{quote(txn_id, safe='')}"))

    def recover(self) -> list[str]:
        status, body = self._request("GET", "/pending")
        if status != 200:
            raise RuntimeError(f"GET /pending answered {status}: {body[:200]!r}")
        ids = json.loads(body)
        if not isinstance(ids, list) or not all(isinstance(x, str) for x in ids):
            raise RuntimeError(f"GET /pending answered something other than a list of ids: {body[:200]!r}")
        return ids

    def _request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout)
        try:
            headers = {"Content-Type": "application/json", **self.headers}
            conn.request(method, self.prefix + path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except (OSError, http.client.HTTPException) as exc:
            return -1, f"{type(exc).__name__}: {exc}".encode()
        finally:
            conn.close()

    @staticmethod
    def _outcome(status: int, body: bytes) -> SinkOutcome:
        if 200 <= status < 300:
            return OK
        text = body[:300].decode("utf-8", "replace")
        if status == -1:
            return Retryable(f"network error: {text}")
        if status == 429 or status >= 500:
            return Retryable(f"HTTP {status}: {text}")
        return Fatal(f"HTTP {status}: {text}")

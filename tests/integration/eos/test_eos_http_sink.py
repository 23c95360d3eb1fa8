"""HTTP 2PC sink against the reference server (real HTTP on loopback), and against misbehaving servers."""
from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from semel.eos import (OK, CommitAborted, CommitSucceeded, EosRuntime, Fatal, RecordingBroker,
                       RecordingTxnBackend, Retryable, SinkGuard, Step)
from semel.eos.sinks.http import HttpSink
from semel.eos.sinks.http_server import ReferenceServer
from semel.eos.testing import check_sink_contract


@pytest.fixture
def server(tmp_path):
    with ReferenceServer(data_dir=tmp_path / "ref") as s:
        yield s


def committed(server):
    return lambda: {t: rows for t, rows in _get(server.url, "/committed")[1].items()}


def _get(url, path, method="GET", body=None):
    host, port = url.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=10)
    c.request(method, path, body=body)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, (json.loads(data) if data else None)


def test_http_sink_meets_the_contract(server):
    check_sink_contract(lambda: HttpSink(server.url), committed(server),
                        [{"id": 1}, {"id": 2}, {"id": 3}, {"id": 4}])


def test_reference_server_keeps_state_across_its_restart(tmp_path):
    with ReferenceServer(data_dir=tmp_path / "d") as s:
        sink = HttpSink(s.url)
        assert sink.prepare("a-0-1", [1]) is OK and sink.prepare("a-0-2", [2]) is OK
        assert sink.commit("a-0-1") is OK
    with ReferenceServer(data_dir=tmp_path / "d") as s:
        sink = HttpSink(s.url)
        assert sink.recover() == ["a-0-2"]
        assert _get(s.url, "/committed")[1] == {"a-0-1": [1]}


def test_repeated_prepare_must_carry_the_same_rows(server):
    sink = HttpSink(server.url)
    assert sink.prepare("a-0-1", [1, 2]) is OK
    assert sink.prepare("a-0-1", [1, 2]) is OK          # a retry after a lost answer
    out = sink.prepare("a-0-1", [3])
    assert isinstance(out, Fatal) and "409" in out.reason


@pytest.mark.parametrize("method,path,body,status", [
    ("POST", "/prepare/a-0-1", b"{not json", 400),
    ("POST", "/prepare/a-0-1", b'{"rows": 1}', 400),
    ("POST", "/prepare/a%2F0", b"[]", 400),
    ("POST", "/explode/a-0-1", b"", 404),
    ("GET", "/nothing", None, 404),
])
def test_reference_server_rejects_bad_requests_clearly(server, method, path, body, status):
    got, payload = _get(server.url, path, method, body)
    assert got == status and "error" in payload
    assert _get(server.url, "/pending") == (200, [])


class _Scripted(BaseHTTPRequestHandler):
    """Answers every request with the scripted status/body (or hangs)."""

    script: dict = {}

    def log_message(self, *a):
        pass

    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        status, body = self.script.get(self.path.split("/")[1], (200, b"[]"))
        if status == "hang":
            self.script["release"].wait(10)
            status, body = 200, b"{}"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer


@pytest.fixture
def scripted():
    release = threading.Event()
    handler = type("H", (_Scripted,), {"script": {"release": release}})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    yield handler.script, f"http://127.0.0.1:{httpd.server_address[1]}"
    release.set()
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("status,cls", [(500, Retryable), (503, Retryable), (429, Retryable), (409, Fatal),
                                        (404, Fatal), (400, Fatal)])
def test_http_status_mapping(scripted, status, cls):
    script, url = scripted
    script["prepare"] = (status, b'{"error": "x"}')
    assert isinstance(HttpSink(url).prepare("a-0-1", []), cls)


def test_unreachable_server_is_retryable_and_hanging_server_times_out(scripted):
    from semel.launch.process import free_port
    out = HttpSink(f"http://127.0.0.1:{free_port()}").commit("a-0-1")
    assert isinstance(out, Retryable) and "network error" in out.reason
    script, url = scripted
    script["commit"] = ("hang", b"")
    out = SinkGuard(HttpSink(url, timeout=0.3)).commit("a-0-1")
    assert isinstance(out, Retryable) and ("timed out" in out.reason or "network error" in out.reason)


def test_garbage_pending_list_fails_recover(scripted):
    script, url = scripted
    script["pending"] = (200, b'{"not": "a list"}')
    res = SinkGuard(HttpSink(url)).recover()
    assert res.failure is not None and "list of ids" in res.failure.reason


def test_bad_base_url_and_rows_are_rejected():
    with pytest.raises(ValueError):
        HttpSink("ftp://x")
    with pytest.raises(TypeError, match="JSON"):
        HttpSink("http://127.0.0.1:1").stage({1, 2})


def test_runtime_cycles_through_the_http_sink(server):
    broker = RecordingBroker(inputs=list(range(7)))
    backend = RecordingTxnBackend(broker, "app-0")
    rt = EosRuntime("app", "0", backend, [HttpSink(server.url, name="web")], commit_interval=0.1)
    rt.start()

    def work(ctx):
        for _ in range(3):
            rec = backend.poll(0)
            if rec is not None:
                ctx.stage("web", {"v": rec.value})
    assert isinstance(rt.run_cycle(work), CommitSucceeded)
    backend.fail("commit_txn")
    out = rt.run_cycle(work)
    assert isinstance(out, CommitAborted) and out.step is Step.COMMIT_TXN
    while broker.position != 7:
        rt.run_cycle(work)
    rows = [r["v"] for _, batch in sorted(_get(server.url, "/committed")[1].items()) for r in batch]
    assert sorted(rows) == list(range(7))
    assert _get(server.url, "/pending")[1] == []

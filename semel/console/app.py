"""The web application: one page per view, live over server-sent events, and the
write actions when the console was started with them allowed.

Each page is its layout around a fragment rendered from the poller's latest
snapshot; /events/PAGE sends that fragment again whenever a newer snapshot is
stored (htmx's SSE extension swaps it in), and /events/series the chart's points.
"""
from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import jinja2
from markupsafe import escape
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from . import actions
from .poller import Poller
from .snapshot import Connect

HERE = Path(__file__).parent
SSE_POLL_S = 0.1
PAGES = ("brokers", "topics", "transactions", "groups", "spark", "check")
TITLES = {"brokers": "Brokers", "topics": "Topics", "transactions": "Transactions", "groups": "Consumer groups",
          "spark": "Spark queries", "check": "semel check"}


@dataclass
class Extras:
    """What the pages beyond the cluster read: a Spark lag listener's metrics and a
    `semel check` report directory (each optional)."""
    spark: Callable[[], dict] | None = None
    check: Callable[[], dict] | None = None


def build(poller: Poller, connect: Connect, allow_writes: bool, extras: Extras | None = None,
          allowed_hosts: list[str] | None = None) -> Starlette:
    """allowed_hosts: the Host header values served (a page of another site that made
    its name resolve to this machine gets nothing); None serves any."""
    extras = extras or Extras()
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=jinja2.select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)
    env.filters["clock"] = lambda ms: time.strftime("%H:%M:%S UTC", time.gmtime(ms / 1000)) if ms else "not yet"

    def fragment(page: str) -> str:
        ctx = {"snap": poller.snapshot, "writes": allow_writes, "plan": actions.abort_plan}
        if page == "spark":
            ctx["spark"] = extras.spark() if extras.spark else None
        if page == "check":
            ctx["check"] = extras.check() if extras.check else None
        return env.get_template(f"{page}.html").render(ctx)

    async def index(request: Request):
        return RedirectResponse("/brokers")

    async def page(request: Request):
        name = request.path_params["page"]
        if name not in PAGES:
            return HTMLResponse(env.get_template("missing.html").render(pages=PAGES, titles=TITLES), 404)
        body = await asyncio.to_thread(fragment, name)
        return HTMLResponse(env.get_template("layout.html").render(
            page=name, pages=PAGES, titles=TITLES, body=body, writes=allow_writes,
            bootstrap=",".join(poller.bootstrap)))

    async def events(request: Request):
        name = request.path_params["page"]
        if name != "series" and name not in PAGES:
            return HTMLResponse("no such page", 404)

        async def stream():
            # Polls the poller's version rather than waiting in a thread: an open page
            # must not hold one of the few worker threads the page renders need.
            seen = -1
            while True:
                while poller.version == seen:
                    if await request.is_disconnected():
                        return
                    await asyncio.sleep(SSE_POLL_S)
                seen = poller.version
                if name == "series":
                    yield {"event": "series", "data": json.dumps(poller.series())}
                else:
                    yield {"event": "update", "data": await asyncio.to_thread(fragment, name)}
        return EventSourceResponse(stream(), ping=15)

    def write(op: Callable[[Request, dict], str]):
        async def endpoint(request: Request):
            if not allow_writes:
                return HTMLResponse('<p class="error" role="alert">This console is read-only: start it with '
                                    '--allow-writes to abort transactions, reset offsets or delete records.</p>', 403)
            refused = _cross_site(request)
            if refused:
                return HTMLResponse(f'<p class="error" role="alert">{escape(refused)}</p>', 403)
            # htmx posts its fields url-encoded; parsed here, so that no multipart parser is needed
            form = {k: v[-1] for k, v in urllib.parse.parse_qs((await request.body()).decode()).items()}
            try:
                text = await asyncio.to_thread(op, request, form)
            except actions.ActionError as exc:
                return HTMLResponse(f'<p class="error" role="alert">{escape(str(exc))}</p>', 409)
            except (KeyError, ValueError) as exc:
                return HTMLResponse(f'<p class="error" role="alert">bad request: missing or wrong field '
                                    f'{escape(str(exc))}</p>', 400)
            poller.refresh_now()
            return HTMLResponse(f'<p class="done" role="status">{escape(text)}</p>')
        return endpoint

    def abort(request: Request, form: dict) -> str:
        return actions.abort(connect, poller.snapshot, form["key"])

    def reset(request: Request, form: dict) -> str:
        to = form["to"]
        if to not in ("earliest", "latest"):
            raise ValueError("to")
        return actions.reset_offsets(connect, poller.snapshot, form["group"], to)

    def delete_records(request: Request, form: dict) -> str:
        return actions.delete_records(connect, poller.snapshot, form["topic"], int(form["partition"]),
                                      int(form["before"]))

    async def no_icon(request: Request):
        return Response(status_code=204)

    routes = [
        Route("/", index),
        Route("/favicon.ico", no_icon),
        Route("/events/{page}", events),
        Route("/actions/abort", write(abort), methods=["POST"]),
        Route("/actions/reset-offsets", write(reset), methods=["POST"]),
        Route("/actions/delete-records", write(delete_records), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        Route("/{page}", page),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)] if allowed_hosts else []
    return Starlette(routes=routes, middleware=middleware)


def _cross_site(request: Request) -> str:
    """Why a write may not come from where this one did ("" when it may). A form on
    another site can POST here from the operator's own browser; it cannot add htmx's
    HX-Request header without the browser asking first (CORS), which nothing here
    allows, and the browser names its origin."""
    if request.headers.get("hx-request") != "true":
        return "writes are taken only from the console's own pages"
    origin = request.headers.get("origin")
    if origin and urllib.parse.urlsplit(origin).netloc != request.headers.get("host"):
        return f"a write from {origin} is not taken: only from the console's own pages"
    return ""

"""The dashboard: a read-only web view of the fleet, served beside the metrics from one model
(monitoring/watch.py). Flask (routing, Jinja2 templates with autoescaping) on Werkzeug's
threaded server; assets ship inside the package (no CDN: it works offline).

    /                   the fleet: every table, its verdict and reasons, lag, files, actions
    /table/<name>       one table: its settings and their origins, charts, actions, queries
    /governor           the governor's queue, what runs, failures and backoff, its heartbeat
    /api/fleet.json     the fleet page's data (the page refreshes from it)
    /metrics            the Prometheus exposition of the same model
    /healthz, /readyz   the collection loop alive; catalog and broker reached

Bound to loopback by default. Bound elsewhere it needs a token (`STREAMBERG_DASHBOARD_TOKEN`
or a file): every request then carries `Authorization: Bearer <token>` or the cookie a visit
to `/?token=<token>` sets (HttpOnly, SameSite=Strict); anything else is answered 401. It
changes nothing: GET and HEAD only.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import Flask, Response, abort, redirect, render_template, request

from streamberg.monitoring.collect import governor_document
from streamberg.monitoring.dashboard.views import (
    FIRST_ROWS,
    fleet_page,
    governor_page,
    heartbeat_document,
    table_page,
)
from streamberg.monitoring.watch import Watch
from streamberg.table_meta.policy import GOVERN_HEARTBEAT_FILE, GOVERN_STATE_FILE

COOKIE = "streamberg_dashboard"
REFRESH_MS = 5000  # how often the fleet page asks for fresh rows


def is_loopback(address: str) -> bool:
    if address in ("localhost", ""):
        return address == "localhost"
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class DashboardRefused(Exception):
    """The dashboard cannot be served as asked (a non-loopback address without a token)."""


def make_app(watch: Watch, state_dir: str, token: str | None = None,
             heartbeat: Callable[[], tuple[bool, str]] | None = None) -> Flask:
    """The dashboard over `watch` (its tables' statuses, each with its effective settings and
    where they came from, and their history) and the governor's state under `state_dir`."""
    here = str(Path(__file__).parent)  # given: Flask cannot find a namespace package's folder itself
    app = Flask("streamberg.monitoring.dashboard", root_path=here, instance_path=here)
    # The page asks for fresh rows as often as the model has new ones (at most every 5 s).
    refresh_ms = int(min(REFRESH_MS, max(250.0, watch.refresh_seconds * 1000)))
    app.config.update(JSON_SORT_KEYS=False)

    @app.before_request
    def _guard() -> Any:
        if request.method not in ("GET", "HEAD"):
            abort(405)
        if token is None or request.path in ("/healthz", "/readyz"):
            return None
        given = request.headers.get("Authorization", "")
        offered = given[7:] if given.startswith("Bearer ") else request.cookies.get(COOKIE, "")
        if offered and hmac.compare_digest(offered.encode(), token.encode()):
            return None
        asked = request.args.get("token")
        if asked and hmac.compare_digest(asked.encode(), token.encode()):
            response = redirect(request.path)  # the token leaves the address bar at once
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
            return response
        return Response("a token is needed: Authorization: Bearer <token>, or open /?token=<token> once\n", 401,
                        {"WWW-Authenticate": "Bearer", "Content-Type": "text/plain; charset=utf-8"})

    @app.after_request
    def _headers(response: Response) -> Response:
        response.headers.setdefault("Content-Security-Policy", "default-src 'self'; img-src 'self' data:")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        return response

    def _facts() -> tuple[Any, float | None]:
        facts = watch.facts
        return (facts.fleet, facts.at) if facts is not None else (None, None)

    # The fleet page and its data are made once a model refresh (and governor state written),
    # not once a request: a thousand rows cost their rendering once, every reader after is served.
    made: dict[str, tuple[Any, Any]] = {}
    made_lock = threading.Lock()

    def _once(kind: str, make: Callable[[], Any]) -> Any:
        facts = watch.facts
        key = (id(facts), facts.at if facts is not None else None, _state_stamp(state_dir))
        with made_lock:
            found = made.get(kind)
            if found is not None and found[0] == key:
                return found[1]
        value = make()
        with made_lock:
            made[kind] = (key, value)
        return value

    @app.get("/")
    def fleet() -> str:
        def make() -> str:
            found, at = _facts()
            return render_template("fleet.html", page=fleet_page(found, governor_document(state_dir), at, watch.history,
                                   heartbeat_document(state_dir)),
                                   refresh_ms=refresh_ms, first_rows=FIRST_ROWS)

        return str(_once("page", make))

    @app.get("/api/fleet.json")
    def fleet_json() -> Response:
        def make() -> bytes:
            found, at = _facts()
            return json.dumps(fleet_page(found, governor_document(state_dir), at, watch.history,
                                   heartbeat_document(state_dir))).encode()

        return Response(_once("json", make), 200, {"Content-Type": "application/json"})

    @app.get("/table/<path:name>")
    def table(name: str) -> str:
        found, at = _facts()
        status = next((s for _, s in found.tables if s.table == name), None) if found is not None else None
        if status is None:
            abort(404)
        history = list(watch.history.get(name, []))
        page = table_page(status, found, governor_document(state_dir), history,
                          status.settings, heartbeat_document(state_dir))
        return render_template("table.html", page=page, refreshed_at=at)

    @app.get("/governor")
    def governor() -> str:
        return render_template("governor.html",
                               page=governor_page(governor_document(state_dir), heartbeat() if heartbeat else None,
                                                  heartbeat_document(state_dir)))

    @app.get("/runbooks/<name>")
    def runbook(name: str) -> Response:
        from streamberg.monitoring.dashboard.runbooks import runbook_text

        text = runbook_text(name)
        if text is None:
            abort(404)
        return Response(text, 200, {"Content-Type": "text/plain; charset=utf-8"})

    @app.get("/favicon.ico")
    def favicon() -> Response:  # asked by a browser on pages without a head (the runbooks' text)
        return app.send_static_file("favicon.svg")

    add_probes(app, watch)
    return app


def add_probes(app: Flask, watch: Watch) -> None:
    """/metrics: the last refresh's exposition (503 before the first); /healthz: 200 while the
    refresh loop lives (503 when stuck); /readyz: 200 while the last refresh reached the catalog
    and the broker (503 and why, else). The same on the dashboard and the bare exporter."""

    @app.get("/metrics")
    def metrics() -> Response:
        if watch.facts is None:
            return Response("no collection finished yet\n", 503, {"Content-Type": "text/plain; charset=utf-8"})
        from prometheus_client.exposition import CONTENT_TYPE_LATEST

        return Response(watch.scrape(), 200, {"Content-Type": CONTENT_TYPE_LATEST})

    @app.get("/healthz")
    def healthz() -> Response:
        ok, why = watch.alive()
        return Response("ok\n" if ok else f"{why}\n", 200 if ok else 503, {"Content-Type": "text/plain; charset=utf-8"})

    @app.get("/readyz")
    def readyz() -> Response:
        ok, why = watch.ready()
        return Response(f"{why}\n", 200 if ok else 503, {"Content-Type": "text/plain; charset=utf-8"})


def make_exporter_app(watch: Watch) -> Flask:
    """`streamberg metrics`: the probes alone (an exporter bound for Prometheus shows no table's
    page; the pages are the dashboard's, behind its token off loopback)."""
    here = str(Path(__file__).parent)
    app = Flask("streamberg.monitoring.exporter", root_path=here, instance_path=here)
    add_probes(app, watch)
    return app


def _state_stamp(state_dir: str) -> tuple[float | None, ...]:
    """When the governor last wrote its state and its heartbeat (None: not written)."""
    stamps: list[float | None] = []
    for name in (GOVERN_STATE_FILE, GOVERN_HEARTBEAT_FILE):
        try:
            stamps.append(os.stat(Path(state_dir) / name).st_mtime)
        except OSError:
            stamps.append(None)
    return tuple(stamps)


def serve_dashboard(app: Flask, address: str, port: int, token: str | None) -> tuple[Any, threading.Thread]:
    """Serve the dashboard on a thread; refused on a non-loopback address without a token."""
    if token is None and not is_loopback(address):
        raise DashboardRefused(f"the dashboard on {address} needs a token (STREAMBERG_DASHBOARD_TOKEN or "
                               f"--dashboard-token-file): it shows every table to whoever reaches it")
    return serve_app(app, address, port, "dashboard")


def serve_app(app: Flask, address: str, port: int, name: str) -> tuple[Any, threading.Thread]:
    """Serve on a thread (Werkzeug's threaded server), with no access log on stderr (the
    service's logs are structured)."""
    from werkzeug.serving import WSGIRequestHandler, make_server

    class Quiet(WSGIRequestHandler):
        def log_request(self, *args: Any, **kwargs: Any) -> None:
            pass

    server = make_server(address, port, app, threaded=True, request_handler=Quiet)
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    return server, thread

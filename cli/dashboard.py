"""The dashboard of a long-running service (`streamberg govern`): its tables' statuses
collected in the background into one model (monitoring/watch.py) that the pages, `/metrics`
and the probes all read (monitoring/dashboard/). A composition root: it joins the governor's
kept tables to the monitoring floor, which never import each other."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamberg.cli.errors import UsageError
from streamberg.common.config import StreambergConfig
from streamberg.common.log import get_logger

DEFAULT_DASHBOARD = "127.0.0.1:9470"
# The default of --dashboard where it is set (a pod's or a test session's: ADDRESS:PORT or off).
DASHBOARD_ENV = "STREAMBERG_DASHBOARD"
DEFAULT_REFRESH_SECONDS = 15.0
TOKEN_ENV = "STREAMBERG_DASHBOARD_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dashboard", default=os.environ.get(DASHBOARD_ENV) or DEFAULT_DASHBOARD,
                        metavar="ADDRESS:PORT",
                        help=f"serve the read-only dashboard (fleet, tables, governor; /metrics, /healthz, /readyz) "
                             f"there (default {DEFAULT_DASHBOARD}: loopback, or the {DASHBOARD_ENV} environment "
                             f"variable; another address needs a token); `off` serves none")
    parser.add_argument("--dashboard-token-file", default=None, metavar="PATH",
                        help=f"the token the dashboard asks for (Authorization: Bearer, or /?token= once); or the "
                             f"{TOKEN_ENV} environment variable; required off loopback")
    parser.add_argument("--dashboard-refresh", type=float, default=DEFAULT_REFRESH_SECONDS, metavar="SECONDS",
                        help=f"collect every table's facts this often for the dashboard (default "
                             f"{DEFAULT_REFRESH_SECONDS:g})")


def parse_address(text: str) -> tuple[str, int] | None:
    """ADDRESS:PORT (or PORT alone, on loopback); None for `off`."""
    if text.strip().lower() in ("off", "none", ""):
        return None
    host, _, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise UsageError(f"--dashboard {text!r}: ADDRESS:PORT, a port alone, or off") from None
    if not 0 < number < 65536:
        raise UsageError(f"--dashboard {text!r}: the port must be between 1 and 65535")
    return (host.strip("[]") or "127.0.0.1"), number


def read_token(args: argparse.Namespace) -> str | None:
    if args.dashboard_token_file:
        try:
            token = Path(args.dashboard_token_file).read_text().strip()
        except OSError as exc:
            raise UsageError(f"--dashboard-token-file {args.dashboard_token_file}: {exc.strerror or exc}") from None
        if len(token) < 16:
            raise UsageError("--dashboard-token-file: the token must be at least 16 characters")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    return token or None


def check(args: argparse.Namespace) -> None:
    """The dashboard's arguments, refused before the service starts anything."""
    from streamberg.monitoring.dashboard.app import is_loopback

    where = parse_address(args.dashboard)
    if args.dashboard_refresh <= 0:
        raise UsageError("--dashboard-refresh needs a positive number of seconds")
    if where is not None and read_token(args) is None and not is_loopback(where[0]):
        raise UsageError(f"--dashboard {args.dashboard}: off loopback the dashboard needs a token "
                         f"(--dashboard-token-file or {TOKEN_ENV}): it shows every table to whoever reaches it")


def governed_collector(configs: Callable[[], list[StreambergConfig]], refusals: Callable[[], dict[str, str]],
                       state_dir: str, known: Callable[[StreambergConfig], Any] | None = None) -> Callable[[], Any]:
    """Every kept table's status and verdict, worst first, as the fleet status holds them.
    `known(config)`: the table's runtime as the governor's keeper holds it (its settings, and
    the metadata it last read: a version the model has not read is read at the next pass)."""
    from streamberg.common.tables import paused_tables
    from streamberg.monitoring.fleet import FleetStatus, sort_worst_first
    from streamberg.monitoring.refresh import StatusModel

    # A table read again when a commit is reported for it, its keeper read another version, or a minute on.
    model = StatusModel(known=known)

    def collect() -> FleetStatus:
        out = FleetStatus(paused=paused_tables(state_dir), refused_tables=dict(refusals()))
        kept = configs()
        out.tables.extend((c.kafka.topic, s) for c, s in zip(kept, model.collect(kept)))
        sort_worst_first(out)
        return out

    return collect


def start(args: argparse.Namespace, base: StreambergConfig, collect: Callable[[], Any],
          stop: threading.Event) -> Any | None:
    """Serve the dashboard as asked (None: `off`); a port in use or a refused address is said
    and the service goes on without it."""
    from streamberg.common.redact import redact
    from streamberg.governor.app import health
    from streamberg.monitoring.dashboard.app import DashboardRefused, make_app, serve_dashboard
    from streamberg.monitoring.metrics import fleet_families
    from streamberg.monitoring.watch import Watch

    check(args)  # the same refusals as before the service started
    where = parse_address(args.dashboard)
    if where is None:
        return None
    token = read_token(args)
    address, port = where
    log = get_logger("dashboard")
    watch = Watch(collect, fleet_families, args.dashboard_refresh, scope="dashboard")
    app = make_app(watch, base.ingest.state_dir, token, lambda: health(base.ingest.state_dir))
    try:
        server, _thread = serve_dashboard(app, address, port, token)
    except DashboardRefused as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        log.warning("dashboard not served; the service goes on without it", address=f"{address}:{port}",
                    error=redact(str(exc.strerror or exc)))
        return None
    watch.start(stop)
    url = f"http://{address if ':' not in address else f'[{address}]'}:{server.server_port}/"
    log.info("dashboard", url=url, refresh_seconds=args.dashboard_refresh,
             access="bearer or cookie" if token is not None else "loopback, open")
    print(f"streamberg dashboard: {url}", file=sys.stderr, flush=True)  # stdout stays the command's own
    return server

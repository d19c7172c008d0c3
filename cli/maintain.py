"""`streamberg maintain`: table maintenance (expire snapshots, orphan files, manifests, retention)."""

from __future__ import annotations

import argparse
import json
import threading
from typing import Any

from streamberg.cli.configs import add_table_argument, config_of
from streamberg.cli.errors import CommandError
from streamberg.common.redact import redact

DESCRIPTION = """\
Housekeeping for the ingest table, so snapshots, metadata and stray files do not grow
without bound. One run does, in this order (each step can be turned off in maintenance:):

  retention   delete rows older than maintenance.retention.days by retention.column
              (off unless days is set; on a table partitioned by day/hour of that column
              the cutoff is rounded down to the partition boundary: whole files go)
  expire      expire snapshots older than maintenance.expire.max_snapshot_age_seconds
              beyond the newest min_snapshots_to_keep, and delete the files only they
              referenced. Never expired: the current snapshot back to the newest one that
              holds ingest's Kafka offsets (ingest resumes from it), and every append
              snapshot whose files the compactor has not rewritten yet
  orphans     delete files under the table location that no snapshot references and that
              are older than maintenance.orphan.safety_age_seconds (default 3 days, at
              least 1 hour), e.g. files of a crashed ingest writer that never committed
  manifests   rewrite the manifests when there are at least maintenance.manifests.min_count
              or they total min_total_bytes

It does not take the compactor's lease: every step is safe against concurrent ingest and
compactor commits (see docs/maintenance.md). Each run is logged, recorded in the catalog
database (table streamberg_maintenance_runs, shown by `streamberg status`) and printed.

Without --once, runs every maintenance.interval_seconds until Ctrl-C/SIGTERM (a run in
progress finishes its current step). Exit status: 0, or 1 when a step failed (--once) or
the table does not exist; 2 for an invalid configuration.

Examples:
  streamberg maintain --config examples/demo.yaml --once --dry-run   # what would go
  streamberg maintain --config examples/demo.yaml --once --json
  streamberg maintain --config examples/demo.yaml                    # on a schedule
"""


def _size(n: int | None) -> str:
    from streamberg.common.human import human_bytes

    return "?" if n is None else human_bytes(n)


def _why(step: dict[str, Any]) -> str:
    return f"error: {step['error']}" if step.get("error") else f"skipped: {step.get('reason', '')}"


def render(result: dict[str, Any]) -> str:
    """The run as a few readable lines (what --json prints as one object)."""
    would = "would be " if result["dry_run"] else ""
    lines = [f"maintenance of {result['table']}{' (dry run, nothing removed)' if result['dry_run'] else ''}"
             f" - {result['status']}"]
    r = result["retention"]
    if r.get("column") and "older_than" in r:
        lines.append(f"  retention  {r['column']} < {r['older_than']}: {r['records_deleted']} records {would}deleted, "
                     f"{r['files_deleted']} files {would}deleted, {r.get('files_rewritten', 0)} rewritten"
                     + ("" if r["ran"] or result["dry_run"] else f" ({_why(r)})"))
    else:
        lines.append(f"  retention  {_why(r)}")
    e = result["expire_snapshots"]
    if "older_than" in e:
        lines.append(f"  expire     {e['expired']} snapshots {would}expired, {e['kept']} kept "
                     f"(older than {e['older_than']}, newest {e['retain_last']} kept); "
                     f"{e['deleted_files']} files, {_size(e['bytes_freed'])} {would}freed")
        for p in e.get("protected", [])[:10]:
            lines.append(f"             protected {p['snapshot_id']}: {p['reason']}")
        if e.get("error"):
            lines.append(f"             {_why(e)}")
    else:
        lines.append(f"  expire     {_why(e)}")
    o = result["orphan_files"]
    if "older_than" in o:
        lines.append(f"  orphans    {o['removed']} files older than {o['older_than']} {would}removed, "
                     f"{_size(o['bytes_freed'])} {would}freed")
        if o.get("skipped_count"):
            first = o["skipped"][0]
            lines.append(f"             {o['skipped_count']} skipped, not the table's to delete "
                         f"(e.g. {first['path']}: {first['reason']})")
    else:
        lines.append(f"  orphans    {_why(o)}")
    m = result["rewrite_manifests"]
    if m["ran"]:
        lines.append(f"  manifests  {m['manifests_before']} -> {m['manifests_after']}")
    elif m.get("would_run"):
        lines.append(f"  manifests  {m['manifests_before']} would be rewritten ({'; '.join(m['reasons'])})")
    else:
        lines.append(f"  manifests  {m.get('manifests_before', '?')} manifests, {_why(m)}")
    lines.append(f"  total      {_size(result['bytes_freed'])} {would}freed in {result['duration_seconds']:.1f} s")
    return "\n".join(lines)


def _maintain(args: argparse.Namespace) -> int:
    from streamberg.common.errors import MaintainError
    from streamberg.common.stop import install_stop_handlers
    from streamberg.maintenance.app import MaintainOptions, run_maintain

    config = config_of(args)
    options = MaintainOptions(once=args.once, dry_run=args.dry_run)
    stop = threading.Event()
    if not (args.once or args.dry_run):
        install_stop_handlers(stop)

    def show(result: dict[str, Any]) -> None:
        print(redact(json.dumps(result) if args.json else render(result)), flush=True)

    try:
        summary = run_maintain(config, options, stop=stop, on_result=show)
    except MaintainError as exc:
        raise CommandError(str(exc)) from exc
    # Stopped before any run (a signal during Spark start-up) is a clean stop, not a failure.
    return 1 if summary.last is not None and summary.last["status"] == "failed" else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "maintain", help="table maintenance: expire snapshots, remove orphan files, rewrite manifests, retention (Spark)",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="the streamberg YAML config (sections catalog, table, maintenance)")
    add_table_argument(parser)
    parser.add_argument("--once", action="store_true", help="one run, then exit (for cron and tests)")
    parser.add_argument("--dry-run", action="store_true",
                        help="one run that reports what would be removed and removes nothing (implies --once)")
    parser.add_argument("--json", action="store_true", help="print each run as one JSON object (default: readable lines)")
    parser.set_defaults(func=_maintain)

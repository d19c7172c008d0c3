"""The scan-report folder (`catalog.scan_reports_dir`) as untrusted input, and its writers.

Any process that can write to the folder can put anything there: a FIFO or a device named
like a report, a symlink to /dev/zero or to a file elsewhere, a file of gigabytes, lines that
are not JSON, JSON nested 100,000 deep, reports whose fields have the wrong types. None of it
may hang, grow or crash a reader, and none of it may cost the reports that are real. So:

- only regular files are read, opened without following links and without blocking (a FIFO
  or a device never is, and a name that is not a regular file is removed: the product owns
  this folder);
- each file is read up to MAX_FILE_BYTES and one fold up to MAX_FOLD_BYTES (files past the
  budget wait for the next fold); a line past MAX_LINE_BYTES is dropped;
- every line is parsed on its own: any exception drops that line, counted (`Taken.dropped`);
- a taken file (`.folding`) is removed only after the statistics holding its lines were saved
  (`Taken.done`), and a `.folding` file left by a fold that died is folded again;
- writers (`append_report`, the Java writer) refuse to follow a link planted at their file's
  name and never block on a FIFO.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPORT_PREFIX = "reports-"
REPORT_SUFFIX = ".jsonl"
TAKEN_SUFFIX = ".folding"
MAX_FILE_BYTES = 64 * 1024 * 1024  # the Java writer starts no line past this size either
MAX_FOLD_BYTES = 256 * 1024 * 1024
MAX_LINE_BYTES = 1024 * 1024
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


@dataclass
class Taken:
    """What one fold took from the folder: the reports (parsed, in file order), what was
    dropped and why, and the files to remove once the statistics are saved."""

    reports: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (report-type, report)
    files: list[Path] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)  # why -> lines or files
    bytes_read: int = 0

    def drop(self, why: str, count: int = 1) -> None:
        self.dropped[why] = self.dropped.get(why, 0) + count

    def done(self) -> None:
        """Remove the taken files (call after the statistics holding them were saved)."""
        for path in self.files:
            try:
                path.unlink()
            except OSError:
                continue


def _is_report_name(name: str) -> bool:
    return name.startswith(REPORT_PREFIX) and (name.endswith(REPORT_SUFFIX) or name.endswith(TAKEN_SUFFIX))


def _remove(path: Path) -> None:
    try:
        path.unlink()  # a symlink's link, never its target
    except OSError:
        pass


def read_regular(path: Path, limit: int) -> tuple[bytes, bool] | None:
    """Up to `limit` bytes of a regular file, opened without following a link and never
    blocking (a FIFO or a device is never read); None when the name is not a regular file (or
    cannot be opened). The flag: the file held more. OSError from the read itself is raised."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None  # a link (ELOOP), or gone
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return data[:limit], len(data) > limit
    finally:
        os.close(fd)


def _lines(data: bytes, taken: Taken) -> Iterator[dict[str, Any]]:
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        if len(raw) > MAX_LINE_BYTES:
            taken.drop("a line longer than 1 MiB")
            continue
        try:
            record = json.loads(raw)
        except RecursionError:
            taken.drop("JSON nested too deep")
            continue
        except Exception:  # noqa: BLE001 - a cut or junk line: dropped, counted
            taken.drop("not JSON (or cut by a concurrent write)")
            continue
        if not isinstance(record, dict):
            taken.drop("not a report object")
            continue
        yield record


def take(folder: Path) -> Taken:
    """Take the folder's report files (renamed `.folding`: a writer's next report starts a new
    file) and parse them, within the byte budgets. The caller holds the fold lock."""
    taken = Taken()
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return taken
    for entry in entries:
        if not _is_report_name(entry.name):
            continue
        path = Path(entry.path)
        try:
            regular = entry.is_file(follow_symlinks=False)
        except OSError:
            regular = False
        if not regular:
            taken.drop("not a regular file (removed)")
            _remove(path)
            continue
        if taken.bytes_read >= MAX_FOLD_BYTES:
            break  # the rest waits for the next fold
        if path.name.endswith(REPORT_SUFFIX):
            target = path.with_name(path.name[: -len(REPORT_SUFFIX)] + TAKEN_SUFFIX)
            if target.exists():  # a file of the same name left mid-fold: fold it first, this next time
                continue
            try:
                os.replace(path, target)
            except OSError:
                continue
            path = target
        try:
            found = read_regular(path, min(MAX_FILE_BYTES, MAX_FOLD_BYTES - taken.bytes_read))
        except OSError:
            continue  # unreadable now: left for the next fold
        if found is None:
            taken.drop("not a regular file (removed)")
            _remove(path)  # the product owns the folder: a link or FIFO named like a report goes
            continue
        data, more = found
        if more:
            taken.drop("bytes past a report file's size cap", 1)
            data = data[: data.rfind(b"\n") + 1]  # the cut line is not a report
        taken.bytes_read += len(data)
        taken.files.append(path)
        for record in _lines(data, taken):
            kind = record.get("report-type")
            # Ours wraps the report; a REST catalog's ReportMetricsRequest is flat.
            report = record.get("report", record) if kind in ("scan-report", "commit-report") else None
            if isinstance(report, dict) and isinstance(kind, str):
                taken.reports.append((kind, report))
            else:
                taken.drop("not a scan or commit report")
    return taken


def append_report(folder: str | Path, kind: str, report: dict[str, Any]) -> None:
    """One report line of this process, in the Java writer's form, into the folder it folds.
    A link or anything but a regular file at the name is refused (OSError), never followed."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{REPORT_PREFIX}python-{os.getpid()}{REPORT_SUFFIX}"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _NONBLOCK | getattr(os, "O_CLOEXEC", 0),
                 0o644)
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise OSError(f"{path}: not a regular file; no report written")
        if found.st_size > MAX_FILE_BYTES:
            return  # bounded: the next fold empties it
        os.write(fd, (json.dumps({"report-type": kind, "report": report}) + "\n").encode())
    finally:
        os.close(fd)

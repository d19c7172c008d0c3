"""Facts about a process from /proc, with nothing heavy imported (the ingest driver reads them
before its slow starts)."""

from __future__ import annotations

from pathlib import Path


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot): with the pid, it names one process
    for good, since a reused pid gets a later start time. None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])

"""The fork server's private folders in the temporary directory: made 0700 by the server,
removed by the next start when their server is gone (a kill -9 leaves no one to clean up)."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import time
from pathlib import Path

from streamberg.common.processes import process_start_time

FOLDER_PREFIX = "streamberg-workers-"
OWNER_NAME = "server"  # "<pid> <start time>" of the server that owns the folder


def remove_stale_folders(root: str | None = None) -> list[Path]:
    """Remove this user's fork-server folders whose server is gone (kill -9 leaves no one to
    clean up); return them."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(FOLDER_PREFIX + "*"):
        try:
            info = folder.lstat()
        except OSError:
            continue
        if not stat_is_private_dir(info) or _owner_alive(folder, info):
            continue
        for entry in folder.iterdir():
            with contextlib.suppress(OSError):
                entry.unlink()
        with contextlib.suppress(OSError):
            folder.rmdir()
            removed.append(folder)
    return removed


def _owner_alive(folder: Path, info: os.stat_result) -> bool:
    try:
        pid, started = (folder / OWNER_NAME).read_text().split()
        return str(process_start_time(int(pid))) == started
    except (OSError, ValueError):
        # No owner file: a server still starting (it writes the file last), or an older
        # streamberg's folder, removed once it is a day old.
        return time.time() - info.st_mtime < 86400


def stat_is_private_dir(info: os.stat_result) -> bool:
    """A real folder (no symlink) of this user, 0700: the only kind a server of ours makes."""
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700

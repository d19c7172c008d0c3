"""The exit codes of every streamberg process: the contract between processes.

The supervisor (`streamberg run`) and wrappers such as Kubernetes key on these numbers,
never on the text a process printed.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # a runtime failure, printed as one line; a restart may help
    USAGE = 2  # bad flags or an invalid configuration: fix it first, a restart cannot help
    FENCED = 3  # the ingest was fenced: another instance writes the table; a restart cannot help
    INTERRUPTED = 130  # a signal stopped the command before it finished (128 + SIGINT)

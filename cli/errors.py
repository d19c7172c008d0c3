"""The command line's own error: a command's refusal, printed as one line (exit 1)."""

from __future__ import annotations


class CommandError(RuntimeError):
    """A command's own refusal (bad flags, a precondition of the command); printed without a
    traceback, exit 1. Library failures are `StreambergError`s (common/errors.py)."""

"""The command line's own errors: a command's refusal (exit 1) or a bad value given to it (exit 2),
printed as one line."""

from __future__ import annotations


class CommandError(RuntimeError):
    """A command's own refusal (bad flags, a precondition of the command); printed without a
    traceback, exit 1. Library failures are `StreambergError`s (common/errors.py)."""


class UsageError(CommandError):
    """A bad value given on the command line (a `--set` a policy key refuses): exit 2, as a
    bad flag or an invalid configuration."""

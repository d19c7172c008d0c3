"""Timestamps as streamberg prints them: ISO-8601 in UTC."""

from __future__ import annotations

import datetime as dt


def iso_from_epoch(seconds: float, timespec: str = "milliseconds") -> str:
    return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc).isoformat(timespec=timespec)


def iso_from_ms(ms: int, timespec: str = "milliseconds") -> str:
    """An Iceberg snapshot's timestamp (epoch milliseconds) as ISO-8601 UTC."""
    return iso_from_epoch(ms / 1000, timespec)

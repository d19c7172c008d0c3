"""Fresh reads: a table as of now, exact: its pinned snapshot plus the Kafka records after
the offsets that snapshot recorded (fresh/read.py). `streamberg query` runs SQL on them in
DuckDB (cli/query.py). docs/fresh-read.md says what is guaranteed and what it costs."""

from streamberg.fresh.read import FreshRead, read

__all__ = ["FreshRead", "read"]

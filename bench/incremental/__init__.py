"""Incremental clustering benchmark (`streamberg bench incremental`, `make bench-incremental`).

Streams ingest commits into a table while the compactor runs a pass every few commits, and
after every pass measures what a point query on each clustering column reads, next to a
full optimize of the same data, and the write amplification so far. Modules:

- ``scenario``: the two streams (a day-partitioned table fed in time order over several days;
  an unpartitioned table whose every commit spans the key space), the loop, the measures.
- ``report``: the PNG charts (files read and write amplification over the passes, and the
  query cost against write amplification for each value of the policy's main knob).
- ``commands``: the CLI.
"""

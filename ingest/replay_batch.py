"""Decoding and writing for `streamberg replay` (ingest/replay.py), as the ingest's writers do.

Replayed records go through the ingest's own decoder (RecordDecoder) and file writer
(PartitionedFileWriter); records that carry fields the table lacks, or values only a wider
column takes, are held and handled by schema evolution (ingest/evolution.py) as the ingest's
committer handles them, except that the schema change is its own commit here.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from streamberg.common.config import StreambergConfig
from streamberg.common.log import get_logger
from streamberg.common.retry import commit_retrying, is_instance
from streamberg.decode.envelopes import record_decoder
from streamberg.decode.records import RecordDecoder
from streamberg.decode.unknown_fields import display
from streamberg.ingest.evolution import EvolvedBatch, SchemaChanges, evolve_and_write, hold_back
from streamberg.ingest.files import PartitionedFileWriter, WrittenFile
from streamberg.ingest.units import DeadLetter, HeldRecord
from streamberg.table_meta.table_files import target_file_size

# Fields named in the log when records carry fields the table lacks (schema_evolution: off).
LOGGED_FIELDS = 20


class ReplayBatcher:
    """Decodes batches of raw values and writes the valid rows into Parquet data files.

    Records carrying fields the table lacks are held, as the ingest's writers hold them
    (ingest/evolution.py): with `ingest.schema_evolution: add`, `finish` adds the fields in a
    schema-only commit (no file references them yet, so no snapshot holds a column its
    schema lacks) and then decodes and writes the held records against the evolved schema;
    with `off` they are written without those fields, which the log names.
    """

    def __init__(self, config: StreambergConfig, table: Table, run_id: str, dry_run: bool):
        self.config, self.table, self.run_id, self.dry_run = config, table, run_id, dry_run
        self.log = get_logger("ingest.replay", table=config.table.identifier, run=run_id)
        self.decoder = self._decoder(table.schema())
        self.files = None if dry_run else self._files(table, table.schema())
        self.added = 0
        self.held: list[HeldRecord] = []
        self.changes = SchemaChanges()
        self.not_written: Counter = Counter()  # schema_evolution: off, per path
        self.fields_added: list[tuple[str, str]] = []

    def _decoder(self, schema: Schema) -> RecordDecoder:
        return record_decoder(self.config, schema)

    def _files(self, table: Table, schema: Schema) -> PartitionedFileWriter:
        return PartitionedFileWriter(
            io=table.io, location=table.location(), schema=schema, spec=table.spec(), properties=table.properties,
            target_file_size=target_file_size(table, default=self.config.table.target_file_size_bytes),
            row_group_rows=self.config.ingest.row_group_rows, name_prefix=f"replay-{self.run_id}-s{schema.schema_id}",
        )

    def decode(self, values: list[bytes | None], keys: list[bytes | None],
               positions: list[tuple[int, int, int | None]]) -> tuple[np.ndarray, list[tuple[int, str]]]:
        """Write the rows that decode; return their indexes and the (index, reason) of the rest.
        Held rows are in neither: `finish` reports them. `positions`: (partition, offset,
        timestamp ms) per value."""
        result = self.decoder.decode(values, keys, ([p for p, _, _ in positions], [o for _, o, _ in positions]))
        if self.config.ingest.schema_evolution == "off":
            self.not_written.update({display(u.path): len(u.rows) for u in result.unknown})
            table, kept, rejected = result.table, result.kept, [(i, str(r)) for i, r in result.rejected]
        else:
            split = hold_back(result, self.decoder.schema, self.changes)
            table, kept, rejected = split.table, split.kept, split.rejected
            for i in split.held:
                partition, offset, ts = positions[int(i)]
                self.held.append(HeldRecord(partition, offset, ts, keys[int(i)], values[int(i)]))
        if table.num_rows and self.files is not None:
            self.files.write(table)
        self.added += table.num_rows
        return kept, rejected

    def finish(self, catalog: Catalog) -> tuple[list[WrittenFile], list[HeldRecord], list[DeadLetter]]:
        """The files, and of the held records those written and those still refused."""
        files = self.files.flush() if self.files is not None else []
        if self.not_written:
            self.log.warning("records carry fields the table lacks; not written (ingest.schema_evolution: off)",
                             fields=dict(self.not_written.most_common(LOGGED_FIELDS)))
        if not self.held:
            return files, [], []
        evolved = self._evolve(catalog)
        self.added += evolved.records
        return files + evolved.files, evolved.landed, evolved.dead_letters

    def _evolve(self, catalog: Catalog) -> EvolvedBatch:
        """Add the held records' fields in a schema-only commit (retried on a lost race), then
        write the held records against it; a dry run plans the same without committing."""
        max_new = self.config.ingest.max_new_fields_per_commit
        for attempt in commit_retrying(self.config.ingest.commit_retries, is_instance(CommitFailedException)):
            with attempt:
                table = catalog.load_table(self.config.table.identifier)
                tx = table.transaction()
                planned = evolve_and_write(tx, self.held, self.changes, max_new, self._decoder, None)
                self.fields_added = planned.added
                if not self.dry_run and (planned.added or planned.widened):
                    tx.commit_transaction()
                    self.log.info("schema evolved for held records", added=[f"{p} {t}" for p, t in planned.added])
                if self.dry_run:
                    return planned
        table = catalog.load_table(self.config.table.identifier)
        return evolve_and_write(table.transaction(), self.held, SchemaChanges(), max_new, self._decoder,
                                lambda schema: self._files(table, schema))

    def abort(self) -> None:
        if self.files is not None:
            self.files.abort()  # files already closed are orphans; maintenance removes them

"""What streamberg keeps about each table, a floor above common/'s infrastructure: the records
in its metadata (snapshot summaries and table properties: offsets, the change log, tail
segments, the dead-letter outbox, field sightings, source epochs, the columns dropped) and in
the catalog database beside it (slots, maintenance runs), the rules read from them (what is
pending, how well it is clustered, what queries read), and the one object per table that reads
them (`table_runtime`)."""

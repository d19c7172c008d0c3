"""`streamberg run`: the local supervisor of the whole loop (ingest, compactor, maintenance)."""

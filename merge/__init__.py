"""The merge stage: applies a primary-key table's change log to it on Spark (docs/cdc.md)."""

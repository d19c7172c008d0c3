"""Data-skipping benchmark: how many files Iceberg's own scan planning skips per layout.

The pipeline, one module per concern:

- ``datagen``: a deterministic SSB-like denormalised ``lineorder`` table from DuckDB's TPC-H
  generator (SSB's city and brand columns derived the way SSB's dbgen derives them).
- ``random_table``: writes it into an Iceberg table as exactly N randomly distributed files.
- ``spark_layouts``: lays the random table out with each of the compactor's layouts (through
  Spark and the Iceberg runtime) into the same number of files.
- ``predicates``: samples point, two-column and range predicates from the data.
- ``planning``: counts the files Iceberg plans to read for each predicate and reads each
  file's min/max bounds from the manifests.
- ``results`` / ``report``: the printed table, the JSON file and the PNG layout report.
- ``pipeline`` ties them together; ``commands`` is the ``streamberg bench skipping`` CLI.
"""

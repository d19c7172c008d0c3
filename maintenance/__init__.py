"""Table maintenance: expire snapshots, remove orphan files, rewrite manifests, retention (TTL).

Each run is recorded with table_meta/maintenance_runs.py, which `streamberg status` reads.
"""

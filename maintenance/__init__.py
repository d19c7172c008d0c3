"""Table maintenance: expire snapshots, remove orphan files, rewrite manifests, retention (TTL)."""

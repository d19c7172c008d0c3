"""Table maintenance: expire snapshots, remove orphan files, rewrite manifests, retention (TTL).

``last_maintenance_run(config)`` (record.py) is what ``streamberg status`` reads.
"""

from streamberg.maintenance.record import last_maintenance_run

__all__ = ["last_maintenance_run"]

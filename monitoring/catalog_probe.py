"""Open the catalog for reading only, and say plainly why it cannot be opened.

The reader lives in common/catalog.py (`streamberg table` needs it too); this module keeps
the names monitoring imports.
"""

from __future__ import annotations

from streamberg.common.catalog import open_catalog_readonly
from streamberg.common.catalog_open import first_line
from streamberg.common.errors import CatalogUnreachable

__all__ = ["CatalogUnreachable", "first_line", "open_catalog_readonly"]

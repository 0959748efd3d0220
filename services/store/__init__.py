"""The SQL performance-history store: models, repository and migrations (the only SQL)."""

from services.store.repository import ExitConfigRow, Store

__all__ = ["ExitConfigRow", "Store"]

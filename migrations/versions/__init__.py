"""Alembic revisions (a package so that installs ship them; Alembic skips this file)."""

"""Alembic migrations for the rlproxy store (run by `rlproxy migrate` and on `rlproxy serve` start)."""

"""The tests' own Postgres: what `make test` starts on a machine with no Postgres server (tests/postgres.py)."""
from __future__ import annotations

import psycopg
import pytest

from migrations.apply import upgrade
from tests.postgres import server_binaries, temporary_server


def _store_round_trip(url: str) -> None:
    """What the suite does with a server: create a database, migrate it, write and read through it."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute('CREATE DATABASE "rlproxy_roundtrip"')
    upgrade(url.replace("postgresql://", "postgresql+asyncpg://").rsplit("/", 1)[0] + "/rlproxy_roundtrip")
    with psycopg.connect(url.rsplit("/", 1)[0] + "/rlproxy_roundtrip") as conn:
        assert conn.execute("SELECT count(*) FROM rollouts").fetchone() == (0,)


def test_the_installed_wheel_starts_a_throwaway_server_without_the_machines_postgres():
    """On a fresh machine these are the only binaries: scripts/install.sh puts them into the virtualenv."""
    binaries = server_binaries(system=False)
    if binaries is None:
        pytest.skip("pgserver is not installed here (scripts/install.sh installs it)")
    with temporary_server(binaries) as url:
        with psycopg.connect(url) as conn:
            assert conn.execute("SHOW server_version").fetchone()[0].startswith("16.")
            assert conn.execute("SHOW fsync").fetchone() == ("off",)
        _store_round_trip(url)
    with pytest.raises(psycopg.OperationalError):  # stopped, its folder gone
        psycopg.connect(url, connect_timeout=2)


def test_the_machines_own_binaries_come_first():
    binaries = server_binaries()
    assert binaries is not None  # the installed wheel's, at least
    wheel = server_binaries(system=False)
    if binaries == wheel:
        pytest.skip("this machine has no PostgreSQL server binaries of its own")
    with temporary_server(binaries) as url:
        _store_round_trip(url)

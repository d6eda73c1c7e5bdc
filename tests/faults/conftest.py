"""Fixtures of the fault tests: a Postgres server of their own that they may stop."""
from __future__ import annotations

import uuid

import pytest

from migrations.apply import upgrade
from tests.faults.postgres import PrivatePostgres, server_binaries


@pytest.fixture
def private_postgres():
    if server_binaries() is None:
        pytest.skip("needs PostgreSQL's server binaries (Debian: apt-get install postgresql)")
    server = PrivatePostgres()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def private_database_url(private_postgres: PrivatePostgres) -> str:
    url = private_postgres.create_database(f"rlproxy_fault_{uuid.uuid4().hex[:8]}")
    upgrade(url)
    return url

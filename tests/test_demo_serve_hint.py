"""The command the demo suggests for its web view names its database without the password (a terminal's
scrollback keeps what is printed, and `rlproxy serve` refuses a password on its command line)."""
from __future__ import annotations

from demo.main import serve_command


def test_a_database_password_is_never_printed_and_the_variable_is_named_instead():
    said = serve_command("postgresql+asyncpg://rl:hunter2@db.example:5432/rlproxy", 8400)
    assert "hunter2" not in said and "RLPROXY_DATABASE_URL" in said and "rl@db.example:5432/rlproxy" in said
    assert "hunter2" not in serve_command("postgresql://rl@db.example/rlproxy?password=hunter2", 8400)
    assert serve_command("sqlite+aiosqlite:////tmp/rlproxy.db", 8400) == \
        "rlproxy serve --database-url sqlite+aiosqlite:////tmp/rlproxy.db --port 8400"

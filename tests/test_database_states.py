"""The database's state reaches a client as 503 with Retry-After (SQLSTATE 55000, object_not_in_prerequisite_state,
as a server in recovery answers: it was 500), and what the request sent reaches the proxy's log escaped (the
percent-decoded path of a request the database failed was logged raw: a newline in it forged a log line, an ESC
drove the terminal)."""
from __future__ import annotations

import psycopg
import requests

from tests.support import running_proxy


def libpq(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


def test_a_database_not_in_the_state_to_answer_is_a_503_to_retry(stub_url, own_database_url, tmp_path):
    with psycopg.connect(libpq(own_database_url), autocommit=True) as conn:
        conn.execute("CREATE FUNCTION not_now() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'not in recovery' "
                     "USING ERRCODE = '55000'; END $$ LANGUAGE plpgsql")
        conn.execute("CREATE TRIGGER not_now BEFORE INSERT ON rollouts FOR EACH ROW EXECUTE FUNCTION not_now()")
    with running_proxy([stub_url], own_database_url, tmp_path, "not-ready") as url:
        answer = requests.post(f"{url}/rollouts", json={"task_id": "t"}, timeout=10)
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "1"
    assert "SQLSTATE 55000" in answer.json()["error"]["message"]


def test_a_request_path_reaches_the_log_escaped(stub_url, own_database_url, tmp_path):
    with psycopg.connect(libpq(own_database_url), autocommit=True) as conn:
        conn.execute("ALTER TABLE rollouts RENAME TO rollouts_elsewhere")  # every read of a rollout fails
    with running_proxy([stub_url], own_database_url, tmp_path, "forged") as url:
        answer = requests.get(f"{url}/rollouts/x%0A2026-01-01%20CRITICAL%20forged%1B%5B2J", timeout=10)
    assert answer.status_code >= 500
    log = (tmp_path / "forged.log").read_text()
    assert "\x1b[2J" not in log
    assert not any(line.startswith("2026-01-01 CRITICAL forged") for line in log.splitlines())
    assert "/rollouts/x\\x0a2026-01-01 CRITICAL forged\\x1b[2J" in log


def test_a_database_message_on_a_key_or_rollout_lookup_reaches_the_log_escaped(stub_url, own_database_url,
                                                                             tmp_path):
    """The edge's own look-up (a call claiming its rollout) failing with a database message that holds a newline
    and an ESC: logged escaped, as every request value and database message is (core/text.py `printable`)."""
    from tests.support import make_key

    key = make_key(own_database_url, "alpha")
    with psycopg.connect(libpq(own_database_url), autocommit=True) as conn:
        conn.execute("CREATE FUNCTION refuse_claim() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION "
                     "E'no\\n2026-01-01 CRITICAL forged\\x1b[2J'; END $$ LANGUAGE plpgsql")
        conn.execute("CREATE TRIGGER refuse_claim BEFORE INSERT ON rollouts FOR EACH ROW "
                     "EXECUTE FUNCTION refuse_claim()")
    with running_proxy([stub_url], own_database_url, tmp_path, "claim", "--auth", "on") as url:
        answer = requests.post(f"{url}/rollouts/claimed-1/v1/chat/completions", timeout=10,
                               headers={"Authorization": f"Bearer {key}"},
                               json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 503, answer.text
    log = (tmp_path / "claim.log").read_text()
    assert "key or rollout lookup failed" in log
    assert "\x1b[2J" not in log
    assert not any(line.startswith("2026-01-01 CRITICAL forged") for line in log.splitlines())

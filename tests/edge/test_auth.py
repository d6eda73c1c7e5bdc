"""Keys, projects and limits, against real `rlproxy serve` processes with the openai SDK as the client.

The secured proxy's engine is a small recording server in this process, so every request the engine gets can
be inspected: the agents' keys must never reach it (it gets the proxy's own engine key), and they must never
reach the database either.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import openai
import psycopg
import pytest
import requests

from tests.support import PYTHON, ROOT, free_port, fresh_database, make_key, running, running_proxy

OPERATOR_KEY = "operator-" + uuid.uuid4().hex
ENGINE_KEY = "engine-" + uuid.uuid4().hex
MODEL = "rec-model"
MAX_TOKENS = 32
MAX_BODY = 64 * 1024
CHAT = [{"role": "user", "content": "What is 6*7?"}]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "rlproxy.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


class RecordingEngine(ThreadingHTTPServer):
    """An OpenAI-compatible engine that answers every chat call alike and keeps what it was sent."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", free_port()), _EngineHandler)
        self.seen: list[tuple[str, dict[str, str], bytes]] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class _EngineHandler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet
        pass

    def _answer(self, payload: dict) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.seen.append((self.path, dict(self.headers), b""))
        self._answer({"object": "list", "data": [{"id": MODEL, "object": "model", "parent": None}]})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.seen.append((self.path, dict(self.headers), raw))
        body = json.loads(raw)
        ids = bool(body.get("return_token_ids"))
        logprobs = {"content": [{"token": "42", "logprob": -0.5, "bytes": [52, 50], "top_logprobs": []}]}
        self._answer({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "42"},
                         "logprobs": logprobs if body.get("logprobs") else None, "finish_reason": "stop",
                         "token_ids": [52, 2] if ids else None}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            "prompt_token_ids": [1, 2, 3] if ids else None,
        })


@dataclass
class Secured:
    url: str
    database_url: str
    engine: RecordingEngine
    keys: dict[str, str] = field(default_factory=dict)

    def client(self, key: str, base_url: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=base_url or f"{self.url}/v1", api_key=key, max_retries=0)

    def get(self, path: str, key: str | None) -> requests.Response:
        return requests.get(self.url + path, headers={"Authorization": f"Bearer {key}"} if key else {})

    def post(self, path: str, key: str | None, **kwargs) -> requests.Response:
        return requests.post(self.url + path, headers={"Authorization": f"Bearer {key}"} if key else {},
                             **kwargs)


@pytest.fixture(scope="module")
def secured(postgres_server, run_dir) -> Secured:
    engine = RecordingEngine()
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    with fresh_database(postgres_server) as database_url:
        created = cli("keys", "create", "--project", "alpha", "--database-url", database_url)
        assert created.returncode == 0, created.stderr
        keys = {
            "alpha": created.stdout.strip(),
            "beta": make_key(database_url, "beta"),
            "admin": make_key(database_url, "ops", admin=True),
            "slow": make_key(database_url, "gamma", rate_limit=0.5, rate_burst=2),
        }
        with running_proxy([engine.url], database_url, run_dir, "proxy-auth", "--max-tokens", str(MAX_TOKENS),
                           "--client-max-size", str(MAX_BODY), "--key-cache-ttl", "1",
                           env={"RLPROXY_ADMIN_KEY": OPERATOR_KEY, "RLPROXY_UPSTREAM_API_KEY": ENGINE_KEY}) as url:
            yield Secured(url, database_url, engine, keys)
    engine.shutdown()


def error_of(response: requests.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_the_key_is_printed_once_and_only_its_hash_is_kept(secured):
    key = secured.keys["alpha"]
    assert key.startswith("rlp_") and len(key) > 40
    listing = cli("keys", "list", "--database-url", secured.database_url)
    assert listing.returncode == 0 and "alpha" in listing.stdout and key not in listing.stdout
    with psycopg.connect(secured.database_url.replace("+asyncpg", "")) as conn:
        hashes = {row[0] for row in conn.execute("SELECT key_hash FROM api_keys")}
    assert hashlib.sha256(key.encode()).hexdigest() in hashes


def test_without_a_valid_key_everything_but_health_is_401(secured):
    for key in ("wrong", "rlp_" + "x" * 43):
        with pytest.raises(openai.AuthenticationError):
            secured.client(key).chat.completions.create(model=MODEL, messages=CHAT)
    error_of(secured.post("/v1/chat/completions", None, json={"model": MODEL, "messages": CHAT}), 401)
    for key in (None, "wrong", "rlp_" + "x" * 43):
        assert error_of(secured.get("/policies", key), 401)["code"] == "invalid_api_key"
        assert error_of(secured.post("/rollouts", key, json={}), 401)
    for header in ("Authorization", "x-api-key"):  # a key that is not UTF-8 (byte 0xff): 401, never a 500
        value = "Bearer rlp_\xff" if header == "Authorization" else "rlp_\xff"
        answer = requests.get(secured.url + "/policies", headers={header: value})
        assert error_of(answer, 401)["code"] == "invalid_api_key"
    assert secured.get("/rollouts/anything", None).headers["WWW-Authenticate"] == "Bearer"
    assert secured.get("/healthz", None).status_code == 200
    assert secured.get("/openapi.json", None).status_code == 200
    answer = secured.client(secured.keys["alpha"]).chat.completions.create(model=MODEL, messages=CHAT)
    assert answer.choices[0].message.content == "42"


def test_another_projects_rollout_answers_404_like_a_missing_one(secured):
    alpha, beta = secured.keys["alpha"], secured.keys["beta"]
    rollout = secured.post("/rollouts", alpha, json={"task_id": "t1"}).json()
    rid = rollout["rollout_id"]
    own = secured.client(alpha, rollout["base_url"]).chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT)
    call_id = own.headers["X-Rlproxy-Call-Id"]

    with pytest.raises(openai.NotFoundError):
        secured.client(beta, rollout["base_url"]).chat.completions.create(model=MODEL, messages=CHAT)
    with pytest.raises(openai.NotFoundError):
        secured.client(beta).with_options(default_headers={"X-Rollout-Id": rid}).chat.completions.create(
            model=MODEL, messages=CHAT)
    # The model list records nothing: under another project's id it answers as under an unused one.
    assert secured.client(beta, f"{secured.url}/rollouts/{rid}/agents/a/v1").models.list().data
    missing = uuid.uuid4().hex
    hidden, absent = error_of(secured.get(f"/rollouts/{rid}", beta), 404), \
        error_of(secured.get(f"/rollouts/{missing}", beta), 404)
    assert hidden["message"].replace(rid, missing) == absent["message"]  # nothing tells them apart
    error_of(secured.post("/reward", beta, json={"rollout_id": rid, "reward": 1.0}), 404)
    error_of(secured.post("/reward", beta, json={"rollout_id": rid, "reward": 1.0, "call_id": call_id}), 404)

    assert secured.post("/reward", alpha, json={"rollout_id": rid, "reward": 1.0}).status_code == 200
    mine = secured.get(f"/rollouts/{rid}", alpha).json()
    assert [c["call_id"] for c in mine["calls"]] == [call_id]  # beta's tries left no trace
    assert mine["reward"] == 1.0
    assert secured.get(f"/rollouts/{rid}", OPERATOR_KEY).status_code == 200  # the operator sees every project


def test_the_operators_rollouts_are_read_by_every_key_and_written_by_the_operator_only(secured):
    """A rollout the operator's key created belongs to no project: every key may read it, but a project's key
    that could set its reward or put its own calls into it would decide what the operator's traffic trains."""
    beta = secured.keys["beta"]
    rollout = secured.post("/rollouts", OPERATOR_KEY, json={"task_id": "ops"}).json()
    rid = rollout["rollout_id"]
    own = secured.client(OPERATOR_KEY, rollout["base_url"]).chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT)
    call_id = own.headers["X-Rlproxy-Call-Id"]

    assert secured.get(f"/rollouts/{rid}", beta).status_code == 200
    with pytest.raises(openai.PermissionDeniedError):
        secured.client(beta, rollout["base_url"]).chat.completions.create(model=MODEL, messages=CHAT)
    for body in ({"rollout_id": rid, "reward": 1.0}, {"rollout_id": rid, "reward": 1.0, "call_id": call_id}):
        assert "belongs to no project" in error_of(secured.post("/reward", beta, json=body), 403)["message"]
    error_of(secured.post(f"/rollouts/{rid}/events", beta, json={"event_type": "reward", "data": {"value": 1}}), 403)

    stored = secured.get(f"/rollouts/{rid}", OPERATOR_KEY).json()
    assert [c["call_id"] for c in stored["calls"]] == [call_id] and stored["reward"] is None and stored["rewards"] == []
    assert secured.post("/reward", OPERATOR_KEY, json={"rollout_id": rid, "reward": 0.5}).status_code == 200


def test_the_event_url_has_the_keys_and_tenancy_of_reward(secured):
    """Agent Lightning's event URL (`AGL_EVENT_URL`): its key is a bearer token, scoped as `POST /reward` is."""
    alpha, beta = secured.keys["alpha"], secured.keys["beta"]
    rid = secured.post("/rollouts", alpha, json={"task_id": "t1"}).json()["rollout_id"]
    reward = {"event_type": "reward", "data": {"value": 1.0}}
    error_of(secured.post(f"/rollouts/{rid}/events", None, json=reward), 401)
    error_of(secured.post(f"/rollouts/{rid}/events", beta, json=reward), 404)
    error_of(secured.post(f"/rollouts/{rid}/events", beta, json={"event_type": "span", "data": {}}), 404)
    assert secured.post(f"/rollouts/{rid}/events", alpha, json=reward).json()["reward"] == 1.0
    assert secured.get(f"/rollouts/{rid}", alpha).json()["reward"] == 1.0


def test_rlproxy_run_with_the_projects_key(secured, tmp_path):
    """The runner sends its key (RLPROXY_API_KEY); the agent asks for "auto", which reaches the engine as its base model;
    this engine always answers 42, so exactly the two tasks whose answer is 42 succeed."""
    from click.testing import CliRunner

    from rlproxy.cli import main

    tasks, log = ROOT / "examples" / "run_tasks.jsonl", tmp_path / "run.jsonl"
    args = ["run", "--proxy", secured.url, "--tasks", str(tasks), "--task-id-field", "id", "--attempts", "1",
            "--agent", "examples.run_agent:solve", "--log", str(log)]
    wrong = CliRunner().invoke(main, args, env={"RLPROXY_API_KEY": "wrong"})
    assert wrong.exit_code == 1 and wrong.output.strip().splitlines() == [
        "rlproxy run: POST /rollouts: 401 invalid API key (unknown or revoked)"]

    # an administrator's key would reach every agent (code a model wrote): refused unless the agents get their own
    for admin in (OPERATOR_KEY, secured.keys["admin"]):
        refused = CliRunner().invoke(main, args, env={"RLPROXY_API_KEY": admin})
        assert refused.exit_code == 2 and "--agent-api-key" in refused.output, refused.output

    seen = len(secured.engine.seen)
    result = CliRunner().invoke(main, args, env={"RLPROXY_API_KEY": secured.keys["alpha"]})
    assert result.exit_code == 0, result.output
    ended = [json.loads(line) for line in log.read_text().splitlines() if '"finished"' in line]
    assert {e["task_id"]: e["reward"] for e in ended} == {"add-3-4": 0.0, "add-2-5": 0.0, "mul-6-7": 1.0,
                                                         "sub-9-4": 0.0, "ten": 0.0, "add-20-22": 1.0}
    assert {json.loads(raw)["model"] for path, _, raw in secured.engine.seen[seen:]
            if path == "/v1/chat/completions"} == {MODEL}
    assert "33%" in result.output  # the summary: 2 of 6 succeeded
    rollout = secured.get(f"/rollouts/{ended[0]['rollout_id']}", secured.keys["beta"])
    assert rollout.status_code == 404  # the runner's rollouts are its key's project's

    # the operator's key for the runner, the project's for its agents: the rollouts are the agents' project's
    log.unlink()
    result = CliRunner().invoke(main, args, env={"RLPROXY_API_KEY": OPERATOR_KEY,
                                                 "RLPROXY_AGENT_API_KEY": secured.keys["alpha"]})
    assert result.exit_code == 0, result.output
    ended = [json.loads(line) for line in log.read_text().splitlines() if '"finished"' in line]
    assert sorted(e["reward"] for e in ended) == [0.0] * 4 + [1.0] * 2
    assert secured.get(f"/rollouts/{ended[0]['rollout_id']}", secured.keys["alpha"]).json()["reward"] is not None
    assert secured.get(f"/rollouts/{ended[0]['rollout_id']}", secured.keys["beta"]).status_code == 404


def test_the_first_call_claims_a_new_rollout_id_for_its_project(secured):
    rid = f"shared-{uuid.uuid4().hex[:8]}"
    base_url = f"{secured.url}/rollouts/{rid}/v1"
    secured.client(secured.keys["beta"], base_url).chat.completions.create(model=MODEL, messages=CHAT)
    with pytest.raises(openai.NotFoundError):
        secured.client(secured.keys["alpha"], base_url).chat.completions.create(model=MODEL, messages=CHAT)
    assert len(secured.get(f"/rollouts/{rid}", secured.keys["beta"]).json()["calls"]) == 1


def test_only_a_recorded_call_claims_a_rollout_id(secured):
    """A model list, a relayed engine route and refused calls under a new id leave it free: the project whose
    policy call is recorded first owns it."""
    alpha, beta = secured.keys["alpha"], secured.keys["beta"]
    rid = f"free-{uuid.uuid4().hex[:8]}"
    chat = f"/rollouts/{rid}/v1/chat/completions"
    assert secured.get(f"/rollouts/{rid}/v1/models", alpha).status_code == 200
    assert secured.get(f"/rollouts/{rid}/agents/a/v1/models", alpha).status_code == 200
    assert secured.get(f"/rollouts/{rid}/health", alpha).status_code == 200
    assert secured.post(f"/rollouts/{rid}/tokenize", alpha, json={"model": MODEL, "prompt": "x"}).status_code == 200
    error_of(secured.post(chat, alpha, json={"model": MODEL}), 400)  # no messages
    error_of(secured.post(chat, alpha, json={"model": MODEL, "messages": CHAT, "max_tokens": MAX_TOKENS + 1}), 400)
    error_of(secured.post(chat, alpha, json={"model": "not-served", "messages": CHAT}), 404)
    error_of(secured.post(chat, alpha, data=b"x" * (MAX_BODY + 1)), 413)
    error_of(secured.post(chat, "wrong", json={"model": MODEL, "messages": CHAT}), 401)
    error_of(secured.get(f"/rollouts/{rid}", alpha), 404)  # still nobody's

    answer = secured.client(beta, f"{secured.url}/rollouts/{rid}/v1").chat.completions.create(
        model=MODEL, messages=CHAT)
    assert answer.choices[0].message.content == "42"
    assert len(secured.get(f"/rollouts/{rid}", beta).json()["calls"]) == 1
    error_of(secured.get(f"/rollouts/{rid}", alpha), 404)  # now beta's
    with pytest.raises(openai.NotFoundError):
        secured.client(alpha, f"{secured.url}/rollouts/{rid}/v1").chat.completions.create(model=MODEL, messages=CHAT)


def test_policy_activation_needs_an_admin_key(secured):
    error = error_of(secured.post("/policies/0/activate", secured.keys["alpha"]), 403)
    assert error["type"] == "permission_error"
    error_of(secured.get("/metrics", secured.keys["alpha"]), 403)
    # ops' admin key owns no policy: the default one answers every project (tests/api/test_access_table.py)
    error = error_of(secured.post("/policies/0/activate", secured.keys["admin"]), 404)
    assert error["message"] == "policy 'default' does not exist or is not this project's"
    activated = secured.post("/policies/0/activate", OPERATOR_KEY)
    assert activated.json() == {"version": 0, "policy": "default", "status": "active"}
    assert secured.post("/policies/v0/activate", OPERATOR_KEY).status_code == 200
    assert [secured.get("/metrics", key).status_code for key in (secured.keys["admin"], OPERATOR_KEY)] == [403, 200]
    assert secured.get("/policies", secured.keys["alpha"]).status_code == 200  # reading is for every key


def test_a_key_over_its_rate_gets_429_with_retry_after(secured):
    client = secured.client(secured.keys["slow"])  # one request every 2 s, bursts of 2
    client.chat.completions.create(model=MODEL, messages=CHAT)
    client.chat.completions.create(model=MODEL, messages=CHAT)
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(model=MODEL, messages=CHAT)
    response = raised.value.response
    wait = int(response.headers["Retry-After"])
    assert 1 <= wait <= 2
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    secured.client(secured.keys["beta"]).chat.completions.create(model=MODEL, messages=CHAT)  # others go on
    time.sleep(wait)
    client.chat.completions.create(model=MODEL, messages=CHAT)


def test_a_body_over_the_limit_is_413(secured):
    client = secured.client(secured.keys["alpha"])
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * MAX_BODY}])
    assert raised.value.status_code == 413
    assert raised.value.response.json()["error"]["code"] == "request_too_large"
    chunked = requests.post(f"{secured.url}/v1/chat/completions", data=iter([b"{" + b" " * MAX_BODY + b"}"]),
                            headers={"Authorization": f"Bearer {secured.keys['alpha']}"})
    error_of(chunked, 413)  # no Content-Length: stopped while reading


def test_max_tokens_over_the_limit_is_400(secured):
    client = secured.client(secured.keys["alpha"])
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=MAX_TOKENS + 1)
    assert raised.value.response.json()["error"]["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=10 * MAX_TOKENS)
    assert client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=MAX_TOKENS).choices


def test_a_revoked_key_stops_working_within_the_cache_ttl(secured):
    created = cli("keys", "create", "--project", "alpha", "--label", "short-lived",
                  "--database-url", secured.database_url)
    key, key_id = created.stdout.strip(), created.stderr.split("key ", 1)[1].split()[0]
    client = secured.client(key)
    client.models.list()
    assert cli("keys", "revoke", key_id, "--database-url", secured.database_url).returncode == 0
    time.sleep(1.5)  # --key-cache-ttl 1
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_agent_keys_are_never_stored_or_forwarded(secured):
    alpha = secured.keys["alpha"]
    rollout = secured.post("/rollouts", alpha, json={}).json()
    client = secured.client(alpha, rollout["base_url"])
    client.chat.completions.create(model=MODEL, messages=CHAT)
    client.chat.completions.create(model=MODEL, messages=CHAT, stream=False, logprobs=True)
    client.models.list()
    secured.get(f"/rollouts/{rollout['rollout_id']}", alpha)  # the calls are in the database now

    secrets = [OPERATOR_KEY, *secured.keys.values()]
    assert secured.engine.seen
    for path, headers, body in secured.engine.seen:
        assert headers.get("Authorization") == f"Bearer {ENGINE_KEY}", path
        sent = json.dumps(headers) + body.decode()
        assert not any(secret in sent for secret in secrets), path
    with psycopg.connect(secured.database_url.replace("+asyncpg", "")) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        stored = "\n".join(str(row[0]) for table in tables
                           for row in conn.execute(f'SELECT t::text FROM "{table}" t'))
    assert "calls" in tables and rollout["rollout_id"] in stored
    assert not any(secret in stored for secret in secrets)
    assert "Bearer" not in stored


def test_redaction_keeps_token_ids_and_drops_text(stub_url, own_database_url, run_dir):
    with running_proxy([stub_url], own_database_url, run_dir, "proxy-redact", "--redact-content") as url:
        rollout = requests.post(f"{url}/rollouts", json={}).json()
        client = openai.OpenAI(base_url=rollout["base_url"], api_key="unused")
        answer = client.chat.completions.create(model="stub-model", messages=[
            {"role": "user", "content": "my secret diagnosis"}])
        client.responses.create(model="stub-model", instructions="secret instructions",
                                input=[{"role": "user", "content": [{"type": "input_text", "text": "secret x"}]}])
        anthropic.Anthropic(base_url=rollout["base_url"].removesuffix("/v1"), api_key="unused").messages.create(
            model="stub-model", max_tokens=16, system="secret system", messages=[{"role": "user",
                                                                              "content": "secret y"}])
        chat, responses, messages = requests.get(f"{url}/rollouts/{rollout['rollout_id']}").json()["calls"]
    assert answer.choices[0].message.content  # the agent gets the text; only the record is redacted
    assert chat["request"]["messages"] == [{"role": "user", "content": "[redacted]"}]
    assert chat["response"]["choices"][0]["message"]["content"] == "[redacted]"
    assert responses["request"]["input"] == [{"role": "user", "content": [{"type": "input_text",
                                                                           "text": "[redacted]"}]}]
    assert responses["response"]["output"][0]["content"][0]["text"] == "[redacted]"
    assert messages["request"]["system"] == "[redacted]" and messages["response"]["content"][0]["text"] == "[redacted]"
    for call in (chat, responses, messages):
        assert call["prompt_token_ids"] and call["completion_token_ids"] and call["completion_logprobs"]
        assert "diagnosis" not in json.dumps(call) and "secret" not in json.dumps(call)
    assert "authentication is OFF" in (run_dir / "proxy-redact.log").read_text()  # loopback, no keys


def test_a_network_bind_without_keys_refuses_to_start(stub_url, own_database_url, run_dir):
    port = free_port()
    args = [PYTHON, "-m", "rlproxy.cli", "serve", "--host", "0.0.0.0", "--port", str(port), "--upstream",
            stub_url, "--database-url", own_database_url, "--spool-path", str(run_dir / "open-spool.jsonl")]
    refused = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0
    assert "refusing to serve on 0.0.0.0 without authentication" in refused.stderr
    assert "--auth off" in refused.stderr
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2)

    log = run_dir / "proxy-open.log"
    with running(args + ["--auth", "off"], f"http://127.0.0.1:{port}/healthz", log_path=log) as _:
        assert requests.post(f"http://127.0.0.1:{port}/rollouts", json={}).status_code == 201
    assert "authentication is OFF on 0.0.0.0 (--auth off)" in log.read_text()


def test_a_flood_of_made_up_keys_is_turned_away_before_the_database(postgres_server, run_dir):
    """Each well-shaped key the cache does not know is looked up in the database. Made-up ones from one address
    are limited (--key-lookup-rate, bursts of five seconds' worth: 429 past it), are cached apart from the real
    keys (which they used to push out, onto the database), and a key already known keeps working."""
    from store.keys import new_key

    with fresh_database(postgres_server) as database_url:
        real = make_key(database_url, "alpha")
        dead_engine = f"http://127.0.0.1:{free_port()}"
        with running_proxy([dead_engine], database_url, run_dir, "proxy-key-flood", "--auth", "on",
                           "--key-lookup-rate", "2") as url:
            def policies(key: str) -> int:
                return requests.get(f"{url}/policies", headers={"Authorization": f"Bearer {key}"}).status_code

            assert policies(real) == 200  # its look-up took one of the ten
            answers = [policies(new_key()) for _ in range(14)]
            assert answers[:9] == [401] * 9 and set(answers[9:]) == {429}
            assert policies(real) == 200  # known: no look-up needed
            assert policies("not-even-shaped-like-a-key") == 401  # never looked up, so never limited
            time.sleep(1.1)
            assert policies(new_key()) == 401  # the bucket refills at the rate

"""Who may do what: the table of docs/security.md ("Who may do what"), key kind × route → allowed, is the
proxy's behaviour. The table is read from the document; every route of the proxy's router must have a row
(a new route without one fails here) and every row a route; then every row is walked with every kind of key
against a running proxy with keys on (tests/tenants.py), once with objects of the caller's project (alpha's
rollouts, response, policy) and once with another project's (beta's). A rollout's own credentials (its token and
its grader token) are walked with their own rollout as the caller's object.

The admin routes are scoped like data: beta's admin key once switched alpha to the base model and then to a
version of alpha's never evaluated (`POST /policies/0/activate?policy=alpha`)."""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

import pytest
import requests

from core.policy_rules import PolicyRules
from core.settings import ProxySettings
from proxy.app import build_app
from proxy.api.endpoints import PREFIXES
from testkit.stub_engine import BASE_MODEL
from tests.support import ROOT

KINDS = {"none": None, "project key": "alpha", "project admin key": "alpha-admin", "operator key": "operator",
         "eval key": "alpha-eval", "rollout token": "token", "grader token": "grader_token"}
TOKENS = ("token", "grader_token")  # a rollout's own credentials: the fields of POST /rollouts' answer
OWN, OTHER = "alpha", "beta"
VERSIONS = {"alpha": 1, "beta": 2}  # each project's active policy version (tests/tenants.py)
CHAT = [{"role": "user", "content": "What is 6*7?"}]
GEMINI = {"contents": [{"role": "user", "parts": [{"text": "What is 6*7?"}]}],
          "generationConfig": {"maxOutputTokens": 4}}
UNKNOWN_PATHS = [("GET", "/no/such/route"), ("POST", "/v1/load_lora_adapter")]


@dataclass(frozen=True)
class Row:
    method: str  # "*" for the row of every other path
    path: str
    mounted: bool  # † : also under each rollout prefix
    cells: dict[str, str]  # key kind -> yes, own, status, 401, 403 or 404

    @property
    def paths(self) -> list[str]:
        return [prefix + self.path for prefix in (PREFIXES if self.mounted else ("",))]


def table() -> list[Row]:
    text = (ROOT / "docs" / "security.md").read_text()
    section = text.split("\n## Who may do what\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        route = re.fullmatch(r"`(GET|POST) (/[^`]*)`( †)?", cells[0])
        if route is not None:
            rows.append(Row(route[1], route[2], bool(route[3]), dict(zip(KINDS, cells[1:]))))
        elif cells[0] == "any other path":
            rows.append(Row("*", "", False, dict(zip(KINDS, cells[1:]))))
    return rows


ROWS = table()


def test_every_route_of_the_router_has_a_row_and_every_row_a_route():
    app = build_app(ProxySettings())
    served = {(route.method, route.resource.canonical) for route in app.router.routes()}
    documented = {(row.method, path) for row in ROWS if row.method != "*" for path in row.paths}
    assert served - documented == set(), "routes without a row in docs/security.md's table"
    assert documented - served == set(), "rows of docs/security.md's table that are no route"
    assert all(set(row.cells.values()) <= {"yes", "own", "status", "401", "403", "404"} for row in ROWS)
    assert [row for row in ROWS if row.method == "*"], "the table says what any other path answers"


CLOSING = ("/reward", "/rollouts/{rollout_id}/events", "/rollouts/{rollout_id}/close", "/v1/traces")  # routes that end or change a rollout


@dataclass
class Objects:
    """One project's objects the walk asks for: a rollout (a fresh one for the routes that close or change
    it), a stored Response, its policy and version."""

    project: str
    rollout_id: str
    response_id: str
    task_id: str
    credentials: dict[str, str]  # the rollout's token and grader token


@pytest.fixture(scope="module")
def objects(tenants) -> dict[str, Objects]:
    found = {}
    for project in (OWN, OTHER):
        task_id = f"task-{project}-{uuid.uuid4().hex[:6]}"
        created = graded_rollout(tenants, project, task_id)
        # the Response is the rollout's (a rollout token reads its own rollout's alone)
        answer = requests.post(f"{created['base_url']}/responses", headers=tenants.headers(project),
                               json={"model": BASE_MODEL, "input": "What is 6*7?"})
        assert answer.status_code == 200, answer.text
        found[project] = Objects(project, created["rollout_id"], answer.json()["id"], task_id,
                                 {name: created[name] for name in TOKENS})
    return found


def graded_rollout(tenants, project: str, task_id: str | None = None) -> dict:
    """A rollout whose grader gives its reward, so that it has both credentials of a rollout."""
    created = requests.post(f"{tenants.url}/rollouts", json={"task_id": task_id, "reward_source": "grader"},
                            headers=tenants.headers(project))
    assert created.status_code == 201, created.text
    return created.json()


def body_for(path: str, rollout_id: str) -> dict | None:
    bare = path.rsplit("}", 1)[-1]
    if path == "/reward":
        return {"rollout_id": rollout_id, "reward": 1.0}
    if path == "/v1/traces":  # a final reward on a root span of the rollout
        return {"resourceSpans": [{
            "resource": {"attributes": [{"key": "rlproxy.rollout_id", "value": {"stringValue": rollout_id}}]},
            "scopeSpans": [{"spans": [{"traceId": uuid.uuid4().hex, "spanId": uuid.uuid4().hex[:16], "name": "run",
                                       "attributes": [{"key": "rlproxy.reward", "value": {"doubleValue": 1.0}}]}]}]}]}
    return {
        "/v1/chat/completions": {"model": BASE_MODEL, "messages": CHAT, "max_tokens": 4},
        "/v1/completions": {"model": BASE_MODEL, "prompt": "6*7=", "max_tokens": 4},
        "/v1/responses": {"model": BASE_MODEL, "input": "What is 6*7?"},
        "/v1/messages": {"model": BASE_MODEL, "max_tokens": 4, "messages": CHAT},
        "/v1/messages/count_tokens": {"model": BASE_MODEL, "messages": CHAT},
        "/detokenize": {"model": BASE_MODEL, "tokens": [1, 2]},
        "/rollouts": {},
        "/close": {},
        "/events": {"event_type": "note", "data": {"step": 1}},
        **dict.fromkeys((":generateContent", ":streamGenerateContent", ":countTokens"), GEMINI),
    }.get(bare, {"model": BASE_MODEL, "prompt": "6*7=", "input": "6*7="})


def attempt(tenants, objects: dict[str, Objects], method: str, path: str, who: str | None, whose: str) -> str:
    """What a caller (`who`: a key of tenants.keys, None for no key) gets on `path` with `whose` objects:
    "served", "hidden" (answered as if the object did not exist), "status" (ready or not, and nothing of what was
    looked at), or the status 401, 403 or 404."""
    credentials = objects[OWN].credentials  # a token's own rollout: the caller's project's object
    if path in CLOSING:
        fresh = graded_rollout(tenants, whose)
        rollout_id = fresh["rollout_id"]
        if whose == OWN:
            credentials = {name: fresh[name] for name in TOKENS}
    else:
        rollout_id = objects[whose].rollout_id
    response_id = objects[whose].response_id
    version = VERSIONS[whose]
    target = path.format(rollout_id=rollout_id, agent="solver", response_id=response_id, version=version,
                         task_id=objects[whose].task_id, name="app.js", model=BASE_MODEL)
    if who in TOKENS:
        headers = {"Authorization": f"Bearer {credentials[who]}"}
    else:
        headers = dict(tenants.headers(who)) if who is not None else {}
    if not path.startswith("/rollouts/"):
        headers["X-Rollout-Id"] = rollout_id  # a bare call of the agent's rollout
    query = {"policy": whose} if path.startswith("/policies") else {"alt": "sse"} if "Generate" in path else {}
    body = body_for(path, rollout_id) if method == "POST" else None
    answer = requests.request(method, tenants.url + target, params=query, json=body, headers=headers, timeout=60)
    assert answer.status_code < 500, (method, target, answer.status_code, answer.text)
    if answer.status_code in (401, 403):
        return str(answer.status_code)
    if path == "/readyz":
        return "status" if answer.json() == {"status": "ready"} else "served"
    if path == "/policies":
        listed = answer.json()
        served = len(listed["data"]) > 1 and whose in listed["policies"] and listed["active"] == version
        hidden = [row["version"] for row in listed["data"]] == [0] and whose not in listed["policies"] \
            and listed["active"] == 0
        assert served or hidden, listed
        return "served" if served else "hidden"
    if path == "/v1/traces":
        assert answer.status_code == 200, answer.text
        refused = answer.json().get("partialSuccess", {})
        assert refused.get("rejectedSpans") in (None, "1"), refused
        return "hidden" if refused and "does not exist" in refused["errorMessage"] else "served"
    if answer.status_code == 404:
        message = answer.json()["error"]["message"]  # every shape (OpenAI's, Anthropic's, Google's) has it here
        if message in (f"rollout {rollout_id!r} does not exist", f"Response with id '{response_id}' not found.",
                       f"task {objects[whose].task_id!r} has no rollouts",
                       f"policy {whose!r} does not exist or is not this project's"):
            return "hidden"
        # served: only the pooling routes this generative engine does not have answer 404 (the proxy's words)
        assert message.startswith("no route "), (method, target, answer.text)
    return "served"


EXPECTED = {"yes": ("served", "served"), "own": ("served", "hidden"), "status": ("status", "status"),
            "401": ("401", "401"), "403": ("403", "403")}


@pytest.mark.parametrize("row", [row for row in ROWS if row.method != "*"],
                         ids=lambda row: f"{row.method} {row.path}{' †' if row.mounted else ''}")
def test_each_kind_of_key_gets_what_the_table_says(tenants, objects, row: Row):
    got, wanted = {}, {}
    for kind, who in KINDS.items():
        for path in row.paths:
            wanted[kind, path] = EXPECTED[row.cells[kind]]
            got[kind, path] = (attempt(tenants, objects, row.method, path, who, OWN),
                               attempt(tenants, objects, row.method, path, who, OTHER))
    assert got == wanted


def test_any_other_path_is_401_without_a_key_and_404_with_one(tenants, objects):
    [row] = [row for row in ROWS if row.method == "*"]
    for kind, who in KINDS.items():
        for method, path in UNKNOWN_PATHS:
            headers = {"Authorization": f"Bearer {objects[OWN].credentials[who]}"} if who in TOKENS else \
                tenants.headers(who) if who else {}
            answer = requests.request(method, tenants.url + path, json={"model": BASE_MODEL}, headers=headers)
            assert str(answer.status_code) == row.cells[kind], (kind, method, path, answer.text)
            assert set(answer.json()["error"]) == {"message", "type", "param", "code"}


def serving(tenants, project: str) -> str | None:
    """The policy version that answers `project`'s calls now."""
    answer = tenants.openai(project).chat.completions.with_raw_response.create(model=BASE_MODEL, messages=CHAT)
    return answer.headers.get("X-Rlproxy-Policy")


def test_a_project_admin_key_switches_only_its_own_projects_policies(tenants):
    activate = lambda who, target: requests.post(f"{tenants.url}/policies/{target}", headers=tenants.headers(who))  # noqa: E731
    refused = {target: activate("beta-admin", target) for target in (
        "0/activate?policy=alpha",  # the attack: alpha back to the base model
        "1/activate",  # alpha's version, by number
        "1/activate?policy=beta",  # ... claimed to be beta's
        "0/activate",  # the default policy: every project no rule names is answered by it
        "0/activate?policy=gamma",  # a policy no rule names: nobody's
        "999/activate",  # no such version
        "01/activate", "+1/activate", "v1/activate",  # other spellings of alpha's version
        "1/activate?policy=alpha&policy=beta",  # the first value is the one read
    )}

    assert {target: answer.status_code for target, answer in refused.items()} == dict.fromkeys(refused, 404)
    messages = {target: answer.json()["error"]["message"] for target, answer in refused.items()}
    assert messages["1/activate"] == messages["999/activate"].replace("999", "1")  # no version told apart
    assert messages["1/activate?policy=beta"] == messages["1/activate"]  # never told whose it is
    assert messages["0/activate?policy=alpha"] == "policy 'alpha' does not exist or is not this project's"
    assert messages["0/activate?policy=gamma"] == "policy 'gamma' does not exist or is not this project's"
    assert serving(tenants, "alpha") == "1"  # nothing changed for alpha

    assert activate("beta-admin", "2/activate").json() == {"version": 2, "policy": "beta", "status": "active"}
    assert activate("alpha-admin", "1/activate?policy=alpha").status_code == 200
    assert activate("alpha", "1/activate").status_code == 403  # not an admin key
    assert activate("operator", "1/activate").status_code == 200  # the operator acts on every policy
    assert serving(tenants, "alpha") == "1" and serving(tenants, "beta") == "2"


def test_a_project_owns_the_policies_only_its_calls_reach():
    rules = PolicyRules.parse(["project:acme=acme", "agent:solver=solver", "project:duo&agent:checker=duo-checker",
                               "project:duo&agent:coder=shared", "agent:coder=shared", "project:acme=default"],
                              default="default")
    assert rules.owned_by("acme") == {"acme"}  # not the default, though a rule names it for acme
    assert rules.owned_by("duo") == {"duo-checker"}  # `shared` is reached by every project's coder too
    assert rules.owned_by("other") == set()  # the default and agent rules answer every project

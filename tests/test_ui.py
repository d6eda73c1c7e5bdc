"""The web view (`/ui/`) in a real headless Chromium against a running proxy with keys on, in front of the stand-in
engine: rollouts recorded through all three wire formats by their real client libraries, looked at as a user would.

Playwright's Python package drives Debian's chromium through its executable (scripts/install.sh installs it where
it can); without it these tests are skipped and say why. With RLPROXY_UI_SCREENSHOTS=DIR the pages' screenshots are
also written to DIR (docs/ui/ holds the committed ones, docs/ui.md shows them).
"""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest
import requests

from testkit.stub_engine import BASE_MODEL
from tests.tenants import secured_tenants

playwright_sync = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (scripts/install.sh installs it)")
SCREENSHOTS = os.environ.get("RLPROXY_UI_SCREENSHOTS")
TASK = "ui-task-" + uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def site(postgres_server, tmp_path_factory):
    """A secured proxy where project alpha recorded a chat, a Responses and a Messages rollout of one task (and 55
    empty ones, for paging), and project beta one chat rollout."""
    with secured_tenants(postgres_server, tmp_path_factory.mktemp("ui"), tmp_path_factory.mktemp("ui-adapters")) as t:
        recorded = {}
        for api, reward in (("chat", 1.0), ("responses", 0.0), ("messages", 0.5)):
            rollout = requests.post(f"{t.url}/rollouts", json={"task_id": TASK, "agent": f"{api}-agent"},
                                    headers=t.headers("alpha")).json()
            base = rollout["base_url"]
            if api == "chat":
                t.openai("alpha", base).chat.completions.create(
                    model=BASE_MODEL, messages=[{"role": "user", "content": "What is 6*7?"}], max_tokens=8)
            elif api == "responses":
                t.openai("alpha", base).responses.create(model=BASE_MODEL, input="Name a colour.", max_output_tokens=8)
            else:
                t.anthropic("alpha", base.removesuffix("/v1")).messages.create(
                    model=BASE_MODEL, max_tokens=8, messages=[{"role": "user", "content": "Say hi."}])
            posted = requests.post(f"{t.url}/reward", json={"rollout_id": rollout["rollout_id"], "reward": reward},
                                   headers=t.headers("alpha"))
            assert posted.status_code == 200, posted.text
            recorded[api] = rollout["rollout_id"]
        for _ in range(55):
            requests.post(f"{t.url}/rollouts", json={"agent": "filler"}, headers=t.headers("alpha"))
        beta = requests.post(f"{t.url}/rollouts", json={"task_id": "beta-task", "agent": "beta-agent"},
                             headers=t.headers("beta")).json()
        t.openai("beta", beta["base_url"]).chat.completions.create(
            model=BASE_MODEL, messages=[{"role": "user", "content": "beta's secret question"}], max_tokens=8)
        recorded["beta"] = beta["rollout_id"]
        yield t, recorded


@pytest.fixture(scope="module")
def browser(site):
    """Chromium, started after the site: Playwright's synchronous API keeps an event loop running in this thread,
    and the site's set-up runs loops of its own."""
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


def open_as(browser, site, who: str | None, hash_: str = "#/rollouts"):
    """A fresh browser tab on the view; the key typed into its form as a user would."""
    t, _ = site
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    outside = []
    page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(t.url) else None)
    page.goto(f"{t.url}/ui/{hash_}")
    if who is not None:
        page.get_by_label("API key").fill(t.keys[who])
        page.get_by_role("button", name="Use key").click()
    page.outside_requests = outside
    return page


def shot(page, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)


def test_without_a_key_nothing_is_shown(browser, site):
    page = open_as(browser, site, None)
    page.get_by_role("heading", name="A key is needed").wait_for()
    assert page.locator("table").count() == 0
    page.close()


def test_the_list_filters_and_pages_and_shows_only_the_keys_project(browser, site):
    _, recorded = site
    page = open_as(browser, site, "alpha")
    page.get_by_text("58 rollouts; page 1").wait_for()
    shot(page, "rollouts")
    body = page.locator("main").inner_text()
    assert recorded["beta"][:12] not in body and "beta-agent" not in body
    assert page.locator("tbody tr").count() == 50
    page.get_by_role("button", name="Next page").click()
    page.get_by_text("58 rollouts; page 2").wait_for()
    assert page.locator("tbody tr").count() == 8
    page.get_by_role("button", name="Previous page").click()
    page.get_by_text("58 rollouts; page 1").wait_for()

    page.get_by_label("Task").fill(TASK)
    page.get_by_label("Reward ≥").fill("0.5")
    page.get_by_role("button", name="Apply").click()
    page.get_by_text("2 rollouts; page 1").wait_for()
    rows = page.locator("tbody").inner_text()
    assert recorded["chat"][:12] in rows and recorded["messages"][:12] in rows and recorded["responses"][:12] not in rows
    assert page.outside_requests == []  # works offline: nothing fetched from anywhere else
    page.close()


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_rollout_page_shows_the_recorded_tokens_and_rewards(browser, site, api):
    t, recorded = site
    rollout_id = recorded[api]
    stored = requests.get(f"{t.url}/rollouts/{rollout_id}", headers=t.headers("alpha")).json()
    page = open_as(browser, site, "alpha", f"#/rollout/{rollout_id}")
    page.get_by_role("heading", name=f"Rollout {rollout_id}").wait_for()
    shot(page, f"rollout-{api}")
    tokens = page.locator(".token")
    ids = stored["calls"][0]["completion_token_ids"]
    assert ids and tokens.count() == len(ids)
    assert [int(x) for x in tokens.evaluate_all("nodes => nodes.map(n => n.dataset.id)")] == ids
    logprobs = tokens.evaluate_all("nodes => nodes.map(n => Number(n.dataset.logprob))")
    assert logprobs == pytest.approx(stored["calls"][0]["completion_logprobs"])
    rewards = page.get_by_role("table", name="Rewards").inner_text()
    assert "final" in rewards and f"{stored['reward']:g}"[:3] in rewards
    answer = page.get_by_role("list", name="answer").inner_text()
    assert answer.strip(), "the answer as the agent saw it"
    page.close()


def test_a_task_group_shows_each_attempt_with_its_advantage(browser, site):
    _, recorded = site
    page = open_as(browser, site, "alpha", f"#/task/{TASK}")
    table = page.get_by_role("table", name=f"Attempts of task {TASK}")
    table.wait_for()
    shot(page, "task-group")
    text = table.inner_text()
    assert all(recorded[api][:12] in text for api in ("chat", "responses", "messages"))
    # rewards 1, 0, 0.5: GRPO gives +1.22, -1.22 and 0 (population std 0.408)
    assert "1.225" in text and "-1.225" in text and "0.000" in text
    page.close()


def test_the_policies_page_shows_each_policy_the_key_may_see(browser, site):
    page = open_as(browser, site, "operator", "#/policies")
    page.get_by_role("heading", name="Policies").wait_for()
    page.get_by_role("region", name="policy alpha").wait_for()
    shot(page, "policies")
    section = page.get_by_role("region", name="policy alpha").inner_text()
    assert "serving v1" in section and "v1 · active" in section
    page.close()


def test_another_projects_key_sees_none_of_it_in_any_page_or_asset(browser, site):
    t, recorded = site
    page = open_as(browser, site, "beta", f"#/rollout/{recorded['chat']}")
    page.get_by_role("heading", name="Could not load this page").wait_for()
    assert "does not exist" in page.locator("main").inner_text()
    page.goto(f"{t.url}/ui/#/task/{TASK}")
    page.get_by_text(f"task '{TASK}' has no rollouts").wait_for()
    page.goto(f"{t.url}/ui/#/rollouts")
    page.get_by_text("1 rollout; page 1").wait_for()
    assert recorded["beta"][:12] in page.locator("tbody").inner_text()
    for asset in ("", "assets/app.js", "assets/style.css"):  # the assets hold no data of anyone's
        text = requests.get(f"{t.url}/ui/{asset}").text
        assert TASK not in text and recorded["chat"] not in text
    for path in (f"/ui/api/rollouts/{recorded['chat']}", f"/ui/api/tasks/{TASK}"):
        assert requests.get(t.url + path, headers=t.headers("beta")).status_code == 404
        assert requests.get(t.url + path).status_code == 401
    listed = requests.get(f"{t.url}/ui/api/rollouts?limit=200", headers=t.headers("beta")).json()
    assert {r["rollout_id"] for r in listed["data"]} == {recorded["beta"]}
    page.close()


def test_the_page_is_served_with_a_policy_that_runs_only_its_own_script(site):
    t, _ = site
    answer = requests.get(f"{t.url}/ui/")
    assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("text/html")
    policy = answer.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    assert requests.get(f"{t.url}/ui/assets/..%2Fapp.py").status_code == 404

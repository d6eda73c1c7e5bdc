"""The web view (`/ui/`) in a real headless Chromium against a running proxy, on what agents can make it show: a
recorded request of any JSON shape (the proxy records what the agent sent, bodies the engine refused included), links
no page made, task ids that are path dot segments, a time typed in the browser's own zone, and a Live refresh that
answers after the user moved to the next page.

The rows are written straight into the proxy's database (the store's own functions): these are shapes a client can
send, and this way each is on the page exactly as stored. Keys are off (no keys in a fresh database, on loopback).
"""
from __future__ import annotations

import asyncio
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlparse

import pytest

from store.calls import write_calls
from store.db import open_database, session_factory
from store.records import CallRecord, ChoiceRecord
from store.rollouts import create_rollout
from tests.support import fresh_database, running_proxy

playwright_sync = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (scripts/install.sh installs it)")
AGENT = "pager-" + uuid.uuid4().hex[:6]

# Requests as agents sent them: each broke the page's conversation view (a TypeError in a loop over a non-list).
ODD_REQUESTS = {
    "tool_calls a number": {"messages": [{"role": "assistant", "content": "x", "tool_calls": 5}]},
    "tool_calls an object": {"messages": [{"role": "assistant", "content": "x", "tool_calls": {}}]},
    "tool_calls [null]": {"messages": [{"role": "assistant", "content": "x", "tool_calls": [None]}]},
    "a message null": {"messages": [None, {"role": {"odd": 1}, "content": [None, 7]}]},
    "input items odd": {"input": [None, 3, {"type": "function_call", "name": {"n": 1}}]},
}
ODD_RESPONSE = {"choices": [None], "output": "not a list"}


def call(rollout_id: str, seq: int, request, response=None) -> CallRecord:
    return CallRecord(id=uuid.uuid4().hex, route="chat", started_at=datetime.now(timezone.utc) + timedelta(seconds=seq),
                      rollout_id=rollout_id, request=request, response=response,
                      choices=[ChoiceRecord(0, [11, 12], [-0.5, -1.5], "stop")])


async def fill(database_url: str) -> dict:
    database = open_database(database_url)
    sessions = session_factory(database)
    made = {"odd": uuid.uuid4().hex, "dots": {}}
    async with sessions() as session, session.begin():
        await create_rollout(session, made["odd"], task_id="odd-task", agent="odd")
        await write_calls(session, [call(made["odd"], n, request, ODD_RESPONSE)
                                    for n, request in enumerate(ODD_REQUESTS.values())])
        for task in (".", ".."):
            made["dots"][task] = uuid.uuid4().hex
            await create_rollout(session, made["dots"][task], task_id=task, agent="dots")
        for _ in range(55):
            await create_rollout(session, uuid.uuid4().hex, agent=AGENT)
    await database.dispose()
    return made


@pytest.fixture(scope="module")
def site(postgres_server, stub_url, tmp_path_factory):
    with fresh_database(postgres_server) as database_url:
        # in a thread of its own: the store's functions are async, and this module's browser keeps a loop running
        with ThreadPoolExecutor(1) as pool:
            made = pool.submit(asyncio.run, fill(database_url)).result()
        with running_proxy([stub_url], database_url, tmp_path_factory.mktemp("ui-robust"), "proxy-ui-robust") as url:
            yield url, made


@pytest.fixture(scope="module")
def browser(site):
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


def open_page(browser, site, hash_: str, init_script: str | None = None, **context):
    url, _ = site
    page = browser.new_context(viewport={"width": 1280, "height": 900}, **context).new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    if init_script:
        page.add_init_script(init_script)
    page.goto(f"{url}/ui/{hash_}")
    page.script_errors = errors
    return page


def test_a_rollout_of_odd_recorded_requests_still_shows_every_call(browser, site):
    _, made = site
    page = open_page(browser, site, f"#/rollout/{made['odd']}")
    page.get_by_role("heading", name=f"Rollout {made['odd']}").wait_for()
    assert page.get_by_text("Could not load this page").count() == 0
    assert page.locator("section.call").count() == len(ODD_REQUESTS)
    for details in page.locator("details").all():
        details.locator("summary").click()
    prompts = page.get_by_role("list", name="prompt").all_inner_texts()
    assert len(prompts) == len(ODD_REQUESTS)
    assert "5" in prompts[0] and "{}" in prompts[1] and "null" in prompts[2]  # each odd value shown as it was sent
    assert page.locator(".token").count() == 2 * len(ODD_REQUESTS)  # the tokens are still there
    assert page.script_errors == []
    page.context.close()


def test_a_malformed_link_says_so(browser, site):
    page = open_page(browser, site, "#/rollout/%E0")
    page.get_by_role("heading", name="Could not load this page").wait_for()
    assert "not valid" in page.locator("main").inner_text()
    page.context.close()


@pytest.mark.parametrize("task", [".", ".."])
def test_task_ids_that_are_dot_segments_open(browser, site, task):
    _, made = site
    page = open_page(browser, site, "#/task/" + task.replace(".", "%2E"))
    table = page.get_by_role("table", name=f"Attempts of task {task}")
    table.wait_for()
    assert made["dots"][task][:12] in table.inner_text()
    page.context.close()


def test_since_and_until_are_the_times_the_widget_shows(browser, site):
    page = open_page(browser, site, "#/rollouts", timezone_id="Asia/Tokyo")  # UTC+9, no summer time
    page.get_by_role("table", name="Rollouts").wait_for()
    page.get_by_label("Since").fill("2026-11-27T09:00")
    page.get_by_label("Until").fill("2026-11-27T10:30")
    page.get_by_label("Live").uncheck()
    with page.expect_request(lambda r: "api/rollouts?" in r.url and "since=" in r.url) as sent:
        page.get_by_role("button", name="Apply").click()
    query = parse_qs(urlparse(sent.value.url).query)
    assert query["since"] == ["2026-11-27T00:00:00.000Z"] and query["until"] == ["2026-11-27T01:30:00.000Z"]
    page.context.close()


# Answers to the first page's requests wait while `slowFirstPage` is set: a Live refresh still on its way.
SLOW_FIRST_PAGE = """
const realFetch = window.fetch;
window.slowFirstPage = false;
window.fetch = async (...args) => {
  const response = await realFetch(...args);
  if (window.slowFirstPage && String(args[0]).includes("api/rollouts?") && !String(args[0]).includes("cursor=")) {
    window.delayed = (window.delayed || 0) + 1;
    await new Promise((resolve) => setTimeout(resolve, 2500));
  }
  return response;
};
"""


def test_a_live_refresh_that_answers_late_does_not_replace_the_next_page(browser, site):
    page = open_page(browser, site, f"#/rollouts?agent={AGENT}", SLOW_FIRST_PAGE)
    page.get_by_text("55 rollouts; page 1").wait_for()
    page.evaluate("window.slowFirstPage = true")
    page.wait_for_function("() => window.delayed >= 1", timeout=10_000)  # a Live refresh of page 1 is on its way
    page.get_by_role("button", name="Next page").click()
    page.get_by_text("55 rollouts; page 2").wait_for()
    page.wait_for_timeout(3000)  # past the late answer
    assert page.locator(".summary").inner_text() == "55 rollouts; page 2"
    assert page.locator("tbody tr").count() == 5
    page.context.close()

"""The yield and the steps, visible: `GET /policies` carries each policy's yield over its last steps, the web view's
rollout page says per call whether it was trained and shows its tokens as text, and its training page draws each
policy's steps over time from the step records (store/step_history.py).

The rows are written straight into the database with the store's own functions, as the trainer writes them (a
step record of core/step_record.py, one step that trained nothing, a decision per call): the trainer's own tests
make them for real (tests/test_trainer_worker.py, tests/test_sampled_training.py). Keys are off here.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
import requests

from core.step_record import StepMetrics, StepRecord, field_names
from proxy.token_text import token_texts
from proxy.upstream import UpstreamPool
from store import policies, step_history, training, verdicts
from store.calls import write_calls
from store.db import open_database, session_factory
from store.records import CallRecord, ChoiceRecord
from store.rollouts import create_rollout
from testkit.stub_engine import token_id
from tests.support import free_port, fresh_database, running_proxy

WORDS = ["The", "answer", "is", "42"]
UNKNOWN = 7  # an id the stand-in engine spells as <7>


def record(reward: float, trained: int, skipped: dict[str, int], kl: float, teacher_kl: float | None = None) -> dict:
    metrics = StepMetrics(loss=0.1, kl=kl, clip_fraction=0.02, agreement_kl=0.001, served_version=0, transitions=4)
    return StepRecord.of(metrics, policy="default", rollouts=4, reward_mean=reward, calls_trained=trained,
                         calls_seen=trained + sum(skipped.values()), calls_skipped=skipped,
                         staleness={"lag_mean": 0.5, "lag_max": 1, "dropped_by_lag": {}},
                         teacher_kl=teacher_kl).as_dict()


async def fill(database_url: str) -> dict:
    """Two steps that made v1 and v2 of the default policy and, between them, one that trained nothing."""
    database = open_database(database_url)
    sessions = session_factory(database)
    rollout, call_id = uuid.uuid4().hex, uuid.uuid4().hex
    ids = [token_id(w) for w in WORDS] + [UNKNOWN]
    async with sessions() as session, session.begin():
        await create_rollout(session, rollout, task_id="t", agent="solver")
        await write_calls(session, [CallRecord(id=call_id, route="chat", started_at=datetime.now(timezone.utc),
                                               rollout_id=rollout, request={"messages": [{"role": "user",
                                                                                          "content": "q"}]},
                                               choices=[ChoiceRecord(0, ids, [-0.1, -2.0, -0.5, -0.01, -3.0],
                                                                     "stop")])])
        # the policy learns from a teacher too: the gap (docs/distillation.md) falls from v1 to v2
        for version, reward, skipped, kl, gap in ((1, 0.25, {"zero_advantage": 2}, 0.01, 0.9),
                                                  (2, 0.75, {}, 0.03, 0.4)):
            if version == 2:  # between the two: a step that trained nothing of the policy
                await training.record_step(session, [], "w", policy_version=None, transition_count=0, metrics={
                    "skipped": {"sampling_altered": 3}, "policies": {"default": {
                        "calls_seen": 3, "calls_trained": 0, "calls_skipped": {"sampling_altered": 3}}}})
            stored = record(reward, 4, skipped, kl, gap)
            await policies.add_candidate(session, version, f"/adapters/v{version}", parent_version=version - 1,
                                         base_model="stub-model", metrics=stored)
            await training.record_step(session, [rollout] if version == 2 else [], "w", policy_version=version,
                                       transition_count=4, metrics=stored,
                                       decisions={call_id: "sampling_altered"} if version == 2 else None)
        await verdicts.add(session, 2, verdicts.COMMAND_GATE, measured="sha256:abc", score=0.8, parent_version=1,
                           parent_score=0.6, promoted=True, evidence={"tasks": 20, "split": "heldout"})
    await database.dispose()
    return {"rollout": rollout, "call": call_id, "ids": ids}


@pytest.fixture(scope="module")
def site(postgres_server, stub_url, tmp_path_factory):
    with fresh_database(postgres_server) as database_url:
        with ThreadPoolExecutor(1) as pool:  # the store is async; a browser test keeps a loop in this thread
            made = pool.submit(asyncio.run, fill(database_url)).result()
        with running_proxy([stub_url], database_url, tmp_path_factory.mktemp("training-view"), "proxy-training") as url:
            yield url, made


def test_the_training_page_charts_only_fields_of_the_step_record():
    assert set(step_history.CHARTED) <= field_names()


async def test_a_policy_s_steps_and_yield_read_back_from_the_step_records(sessions):
    name = "steps-" + uuid.uuid4().hex[:8]  # the Postgres database is the run's: other tests record steps too
    async with sessions() as session, session.begin():
        made = []
        for skipped in ({"too_long": 1}, {"too_long": 2, "greedy_sampling": 1}):
            version = await policies.next_version(session)
            stored = record(0.5, 3, skipped, 0.02)
            await policies.add_candidate(session, version, f"/a/v{version}", parent_version=None, base_model="m",
                                         metrics=stored, policy=name)
            await training.record_step(session, [], "w", policy_version=version, transition_count=3, metrics=stored)
            made.append(version)
        await training.record_step(session, [], "w", policy_version=None, transition_count=0,
                                   metrics={"failed": "RuntimeError: boom", "skipped": {"step_failed": 4}})
    async with sessions() as session:
        steps = await step_history.policy_steps(session, name)
        assert [s["version"] for s in steps] == made  # the failed step holds no policy's yield: left out
        assert steps[1]["calls_skipped"] == {"too_long": 2, "greedy_sampling": 1} and steps[1]["kl"] == 0.02
        assert await step_history.recent_yield(session, name, window=1) == {
            "steps": 1, "calls_seen": 6, "calls_trained": 3, "calls_skipped": {"too_long": 2, "greedy_sampling": 1},
            "share_trained": 0.5}
        assert (await step_history.recent_yield(session, name + "-none"))["share_trained"] is None


async def pool_state(url: str) -> SimpleNamespace:
    """What proxy/token_text.py reads of a proxy's state: its engines and the base model they serve."""
    pool = UpstreamPool([url], timeout=30)
    await pool.start()
    return SimpleNamespace(upstreams=pool, router=SimpleNamespace(base_model="stub-model"))


async def test_token_text_comes_from_the_engine_and_an_engine_away_leaves_the_ids(stub_url):
    ids = [token_id("answer"), token_id("42")]
    app = await pool_state(stub_url)
    assert await token_texts(app, [ids, None, [UNKNOWN]]) == [["answer", "42"], None, [f"<{UNKNOWN}>"]]
    await app.upstreams.close()
    away = await pool_state(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    many = list(range(1000, 1400))
    began = time.monotonic()
    assert await token_texts(away, [many]) == [[None] * len(many)]
    assert time.monotonic() - began < 3  # given up at the first failure, not tried (with retries) per id
    await away.upstreams.close()


def test_policies_carry_each_policy_s_yield_over_its_last_steps(site):
    url, _ = site
    listed = requests.get(f"{url}/policies").json()
    assert listed["yields"]["default"] == {"steps": 3, "calls_seen": 13, "calls_trained": 8,
                                           "calls_skipped": {"zero_advantage": 2, "sampling_altered": 3},
                                           "share_trained": pytest.approx(8 / 13)}


def test_the_training_route_answers_the_steps_in_order_and_refuses_a_bad_name(site):
    url, _ = site
    steps = requests.get(f"{url}/ui/api/training").json()["data"]
    assert [s["version"] for s in steps] == [1, None, 2]
    assert steps[1]["calls_skipped"] == {"sampling_altered": 3} and steps[1]["reward_mean"] is None
    refused = requests.get(f"{url}/ui/api/training", params={"policy": "no/such"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "policy"


playwright_sync = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOTS = os.environ.get("RLPROXY_UI_SCREENSHOTS")  # a folder: the pages' screenshots go there (docs/ui/)


def shot(page, name: str) -> None:
    if SCREENSHOTS:
        page.screenshot(path=os.path.join(SCREENSHOTS, f"{name}.png"), full_page=True)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (scripts/install.sh installs it)")
def test_a_user_sees_the_tokens_as_text_what_was_trained_and_the_steps_over_time(site):
    url, made = site
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{url}/ui/#/rollout/{made['rollout']}")
        page.get_by_role("heading", name=f"Rollout {made['rollout']}").wait_for()
        tokens = page.locator(".token")
        assert tokens.all_inner_texts() == WORDS + [f"<{UNKNOWN}>"]  # the engine's tokenizer's text
        assert tokens.first.get_attribute("title").startswith(f"token {made['ids'][0]} · logprob -0.1000")
        assert page.locator('dd[data-fact="training"]').inner_text() == "not trained: sampling_altered"
        shot(page, "rollout-tokens")

        page.goto(f"{url}/ui/#/training")
        section = page.get_by_role("region", name="training of default")
        section.wait_for()
        assert "2 versions trained in 3 steps" in section.inner_text()
        assert "8 of 13 calls trained (62%)" in section.inner_text()
        charts = [c.get_attribute("aria-label") for c in section.get_by_role("img").all()]
        assert any(c.startswith("Step reward") and "v1 0.2500" in c and "v2 0.7500" in c for c in charts)
        assert any("step " in c and "0/3 trained, sampling_altered 3" in c for c in charts)
        assert any(c.startswith("KL to the base model") and "v2 0.0300" in c for c in charts)
        assert any(c.startswith("Teacher gap") and "v1 0.9000" in c and "v2 0.4000" in c for c in charts)
        shot(page, "training")

        page.goto(f"{url}/ui/#/policies")
        policy = page.get_by_role("region", name="policy default")
        policy.wait_for()
        assert "Last 3 steps: 8 of 13 calls trained (62%)" in policy.inner_text()
        verdict = policy.locator("dl.fields").first.inner_text()
        assert "parent score" in verdict and "0.600" in verdict and "{" not in verdict  # fields, not JSON
        shot(page, "policies-yield")
        assert errors == []
        browser.close()

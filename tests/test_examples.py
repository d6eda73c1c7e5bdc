"""The framework examples (examples/): each runs one episode of the demo's calculator agent through a
real `rlproxy serve` (Postgres) in front of the real engine, and the proxy holds what training needs: every
call with its prompt and completion token ids and one logprob per completion token, and the reward the
example posted.

Frameworks that fit the main virtualenv (the `examples` extra) run in this process through their
`run_episode`; those whose pins clash with the engine's stack run as a script with their own virtualenv's
python, `$VENV/examples/<name>`, which scripts/install-examples.sh builds."""
from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import math
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
import requests

from examples.common import opening, pick_task
from tests.support import ROOT, running_proxy

pytestmark = pytest.mark.engine

IN_PROCESS = ["openai_sdk", "langchain", "openai_agents"]
OWN_VENV = ["autogen", "crewai"]
EXAMPLE_VENVS = Path(sys.prefix) / "examples"  # scripts/install-examples.sh: $VENV/examples/<name>
SEED = 7  # any training problem does (the examples' default is 3)


@pytest.fixture(scope="module")
def examples_proxy(engine_url: str, database_url: str, tmp_path_factory) -> str:
    workdir = tmp_path_factory.mktemp("examples")
    with running_proxy([engine_url], database_url, workdir, "examples-proxy") as url:
        yield url


def run_in_process(name: str, proxy: str, model: str, rollout_id: str) -> dict:
    try:
        module = importlib.import_module(f"examples.{name}_agent")
    except ImportError as exc:
        pytest.fail(f"the {name} example cannot be imported ({exc}): pip install -e '.[examples]'")
    outcome = module.run_episode(proxy, model, pick_task(SEED), rollout_id)
    if inspect.isawaitable(outcome):
        outcome = asyncio.run(outcome)
    return vars(outcome)


def run_in_own_venv(name: str, proxy: str, model: str, rollout_id: str) -> dict:
    python = EXAMPLE_VENVS / name / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: run scripts/install-examples.sh (make install does)")
    done = subprocess.run(
        [str(python), "-m", f"examples.{name}_agent", "--proxy", proxy, "--model", model, "--seed", str(SEED),
         "--rollout-id", rollout_id, "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.engine
@pytest.mark.parametrize("name", IN_PROCESS + OWN_VENV)
def test_an_example_episode_is_recorded_with_tokens_logprobs_and_its_reward(
        name, examples_proxy, engine_model, database_url):
    rollout_id = f"example-{name}-{uuid.uuid4().hex[:8]}"
    run = run_in_process if name in IN_PROCESS else run_in_own_venv
    outcome = run(name, examples_proxy, engine_model, rollout_id)
    task = pick_task(SEED)
    assert outcome["rollout_id"] == rollout_id and outcome["task_id"] == task.task_id
    assert outcome["reward"] in (0.0, 1.0) and 1 <= len(outcome["replies"]) <= 3

    response = requests.get(f"{examples_proxy}/rollouts/{rollout_id}", timeout=30)
    assert response.status_code == 200, response.text
    rollout = response.json()
    assert rollout["status"] == "finished" and rollout["task_id"] == task.task_id
    assert rollout["reward"] == outcome["reward"]
    assert [(r["kind"], r["value"]) for r in rollout["rewards"] if r["kind"] == "final"] == [
        ("final", outcome["reward"])]

    calls = rollout["calls"]
    assert len(calls) == len(outcome["replies"]) >= 1  # one recorded call per model reply, nothing extra
    # the framework sent the demo's opening (system prompt, worked examples, question) as it is
    assert [(m["role"], m["content"]) for m in calls[0]["request"]["messages"]] == [
        (m["role"], m["content"]) for m in opening(task)]
    for call, reply in zip(calls, outcome["replies"]):
        assert call["status"] == "ok" and call["model"] == engine_model
        assert call["prompt_token_ids"], call
        assert call["completion_token_ids"], call
        assert len(call["completion_logprobs"]) == len(call["completion_token_ids"])
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in call["completion_logprobs"])
        assert call["response"]["choices"][0]["message"]["content"] == reply  # what the framework got back
    # each later call carries the history unchanged, so the episode trains as one token sequence
    assert all(call["prefix_kind"] in ("extends", "retokenized") for call in calls[1:]), calls

    # and in the database: typed arrays of matching lengths, the reward on the rollout row
    with psycopg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://", 1)) as db:
        row = db.execute(
            "SELECT r.reward, count(*), bool_and(cardinality(c.prompt_token_ids) > 0), "
            "bool_and(cardinality(ch.token_ids) > 0 "
            "         AND cardinality(ch.token_ids) = cardinality(ch.logprobs)) "
            "FROM rollouts r JOIN calls c ON c.rollout_id = r.id JOIN call_choices ch ON ch.call_id = c.id "
            "WHERE r.id = %s GROUP BY r.reward", (rollout_id,)).fetchone()
    assert row == (outcome["reward"], len(calls), True, True)

"""Several named policies, for real: a two-role agent (examples/solver_reviser.py: a solver drafts an answer, a
reviser writes the final answer from the draft), unmodified, through one proxy with the real engine, for two
tenants on one proxy at once:

* project `solo`: only the solver learns (policy `solo-solver`); its reviser is the base model throughout;
* project `duo`: both roles learn, as the separate policies `duo-solver` and `duo-reviser`.

The routing rules say all of it (`project:duo&agent:reviser=duo-reviser`, ...; anything else: `base`), and one
trainer trains the three policies in turn, each from the calls it answered: the shared episode reward (the final
answer's success) and each role's own call's reward for its own part (the draft, the final answer). The test
checks what must hold however much was learned: each trained policy's versions answered its role's calls and no
other's, the solo reviser was the base model throughout, no project was answered by another project's adapter.
It prints each role's held-out success before and after: the solvers' drafts on held-out items, the revisers'
final answers made from one fixed set of the base model's own drafts (so that a reviser's score does not move
with its solver's); with six rounds or more it asserts that each trained role's rose. docs/policies.md has the
measured runs (`bench/learning_runs.py multi-agent`: RLPROXY_TEST_MULTI_AGENT_ROUNDS=6
RLPROXY_TEST_MULTI_AGENT_HELDOUT=32, output in bench/results/); several LoRAs in one batch make the CPU engine
slow, so the default run is one round of one task group per project (8 episodes each).
"""
from __future__ import annotations

import asyncio
import os
import random
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from bench.families.base import Item
from bench.families.lists import FAMILY
from examples.solver_reviser import (
    REVISER,
    SOLVER,
    evaluation_headers,
    follows,
    revise,
    run_episode,
)
from store.db import open_database, session_factory
from store.models import Call
from tests.support import make_key, running, running_proxy, trainer_command, wait_http

pytestmark = [pytest.mark.engine, pytest.mark.train, pytest.mark.slow]

PROJECTS = ("solo", "duo")
RULES = ("project:solo&agent:solver=solo-solver", "project:duo&agent:solver=duo-solver",
         "project:duo&agent:reviser=duo-reviser")
TRAINED = ("solo-solver", "duo-solver", "duo-reviser")
ROUNDS = int(os.environ.get("RLPROXY_TEST_MULTI_AGENT_ROUNDS", "1"))
GROUP = 8
PER_PROJECT = int(os.environ.get("RLPROXY_TEST_MULTI_AGENT_PER_PROJECT", "8"))  # episodes per project and round
# Held-out items per project: where learning is not asserted they only make each trained role answer a call
# (the routing checks), which four do.
HELDOUT = int(os.environ.get("RLPROXY_TEST_MULTI_AGENT_HELDOUT", "4"))
AT_ONCE = 16  # episodes in flight: more only queue in the engine (and time out there)
# Six rounds are what learning takes here (docs/policies.md); the default, shorter run checks everything else.
LEARNS = ROUNDS >= 6


@pytest.fixture
def trainer(engine_url: str, own_database_url: str, tmp_path: Path):
    from engine.model import prepare_model

    policies = [arg for name in TRAINED for arg in ("--policy", name)]
    command = trainer_command(own_database_url, engine_url, prepare_model(), tmp_path / "adapters",
                              "--poll-interval", "0.2",
                              *policies, settings={"batch_rollouts": 2 * PER_PROJECT, "group_size": GROUP,
                                                   "mini_batches": 4, "learning_rate": 1e-3, "group_timeout_s": 120,
                                                   "batch_timeout_s": 600})
    with running(command, None, log_path=tmp_path / "trainer.log") as process:  # stopped at the end
        yield process


Draft = tuple[Item, str]  # an item and a solver's draft answer to it


async def solver_success(proxy: str, model: str, keys: dict[str, str]) -> tuple[dict[str, float], list[Draft]]:
    """Each project's solver success (drafts that follow the instruction) on the held-out items, in whole
    episodes sent as evaluation rollouts; and every draft, to revise later."""
    items = FAMILY.sample("heldout", HELDOUT)
    slots = asyncio.Semaphore(AT_ONCE)

    async def episode(project: str, item: Item):
        async with slots:
            return item, await run_episode(proxy, model, item, evaluation=True, api_key=keys[project])

    runs = await asyncio.gather(*(asyncio.gather(*(episode(p, item) for item in items)) for p in PROJECTS))
    success = {p: sum(e.drafted for _, e in eps) / len(eps) for p, eps in zip(PROJECTS, runs)}
    return success, [(item, e.draft) for eps in runs for item, e in eps]


async def reviser_success(proxy: str, model: str, keys: dict[str, str], drafts: list[Draft]) -> dict[str, float]:
    """Each project's reviser: the share of final answers that follow the instruction, made from the same fixed
    drafts (the base model's own, so that a reviser's score does not move with its solver's)."""
    slots = asyncio.Semaphore(AT_ONCE)

    async def revised(project: str, item: Item, draft: str) -> bool:
        async with slots:
            final, _ = await revise(proxy, model, item, draft, rollout_id=f"eval-{uuid.uuid4().hex}",
                                    key=keys[project], headers=evaluation_headers(item))
        return follows(item, final)

    runs = await asyncio.gather(*(asyncio.gather(*(revised(p, *d) for d in drafts)) for p in PROJECTS))
    return {p: sum(run) / len(run) for p, run in zip(PROJECTS, runs)}


async def train_for(proxy: str, model: str, keys: dict[str, str],
                    trainer: subprocess.Popen) -> list[tuple[float, float]]:
    """On-policy rounds: a batch of episodes per project, then wait until the trainer has consumed them and
    each policy serves what it produced."""
    pool = FAMILY.items("train")
    random.Random(5).shuffle(pool)
    progress = []
    async with httpx.AsyncClient(base_url=proxy, timeout=30) as http:
        for round_ in range(ROUNDS):
            batch = [(p, pool[(len(PROJECTS) * 2 * round_ + 2 * i + g) % len(pool)])
                     for i, p in enumerate(PROJECTS) for g in range(PER_PROJECT // GROUP) for _ in range(GROUP)]
            episodes = await asyncio.gather(*(run_episode(proxy, model, item, api_key=keys[p]) for p, item in batch))
            duo = [e for (project, _), e in zip(batch, episodes) if project == "duo"]
            progress.append((round(sum(e.drafted for e in duo) / len(duo), 2),
                            round(sum(e.solved for e in duo) / len(duo), 2)))
            for _ in range(1200):
                assert trainer.poll() is None, "the trainer exited"
                done = (await http.get(f"/rollouts/{episodes[-1].rollout_id}",
                                       headers={"Authorization": f"Bearer {keys['duo']}"})).json()["trained"]
                if done and await all_serving_newest(http, keys):
                    break
                await asyncio.sleep(0.5)
            else:
                raise AssertionError(f"round {round_} was not trained and served within 10 minutes")
    return progress


async def all_serving_newest(http: httpx.AsyncClient, keys: dict[str, str]) -> bool:
    for policy in TRAINED:
        body = (await http.get("/policies", params={"policy": policy},
                               headers={"Authorization": f"Bearer {keys[policy.split('-')[0]]}"})).json()
        if body["active"] != max(p["version"] for p in body["data"]):
            return False
    return True


async def served_by(database_url: str) -> dict[tuple[str, str], set[tuple[str, int]]]:
    """(project, agent) -> the (policy, version) pairs that answered its calls."""
    database = open_database(database_url)
    try:
        async with session_factory(database)() as session:
            rows = (await session.execute(
                select(Call.project, Call.agent, Call.policy, Call.policy_version, func.count())
                .group_by(Call.project, Call.agent, Call.policy, Call.policy_version))).all()
    finally:
        await database.dispose()
    answered: dict[tuple[str, str], set[tuple[str, int]]] = {}
    for project, agent, policy, version, _ in rows:
        answered.setdefault((project, agent), set()).add((policy, version))
    return answered


def test_each_trained_role_is_its_own_policy_and_the_untrained_role_stays_the_base_model(
        engine_url, engine_model, own_database_url, tmp_path, trainer):
    keys = {p: make_key(own_database_url, p) for p in PROJECTS}
    rules = [arg for rule in RULES for arg in ("--policy-rule", rule)]
    with running_proxy([engine_url], own_database_url, tmp_path, "proxy-multi-agent", *rules,
                       "--default-policy", "base") as proxy:
        wait_http(proxy + "/readyz", timeout=60)
        if LEARNS:  # the base measurement only matters where learning is asserted
            solver_before, drafts = asyncio.run(solver_success(proxy, engine_model, keys))
            reviser_before = asyncio.run(reviser_success(proxy, engine_model, keys, drafts))
        progress = asyncio.run(train_for(proxy, engine_model, keys, trainer))
        solver_after, after_drafts = asyncio.run(solver_success(proxy, engine_model, keys))
        if not LEARNS:
            solver_before, reviser_before, drafts = None, None, after_drafts
        reviser_after = asyncio.run(reviser_success(proxy, engine_model, keys, drafts))
    answered = asyncio.run(served_by(own_database_url))
    print(f"held-out solver success: before {solver_before} after {solver_after}; reviser success on "
          f"{len(drafts)} fixed base drafts: before {reviser_before} after {reviser_after}; "
          f"duo (drafts right, final answers right) per round {progress}")

    # who answered whom: the rules, and nothing else
    assert answered[("solo", REVISER)] == {("base", 0)}
    for (project, agent), served in answered.items():
        policies = {policy for policy, _ in served}
        expected = {"base"} if (project, agent) == ("solo", REVISER) else {"base", f"{project}-{agent}"}
        assert policies <= expected, (project, agent, served)  # base: before the policy's first version
    for role in (("solo", SOLVER), ("duo", SOLVER), ("duo", REVISER)):
        assert {v for _, v in answered[role]} - {0}, f"{role} was never answered by a trained version"
    trained = {role: {v for _, v in answered[role]} - {0} for role in answered}
    assert trained[("solo", SOLVER)].isdisjoint(trained[("duo", SOLVER)] | trained[("duo", REVISER)])
    assert trained[("duo", SOLVER)].isdisjoint(trained[("duo", REVISER)])

    if LEARNS:  # each trained role's own success rose; the solo reviser is the base model (asserted above)
        for project in PROJECTS:
            assert solver_after[project] > solver_before[project], (project, solver_before, solver_after)
        assert reviser_after["duo"] > reviser_before["duo"], (reviser_before, reviser_after)

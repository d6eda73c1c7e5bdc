"""The demo's task family and agent, without an engine: splits, the protocol parser, the calculator, and
whole episodes against a scripted OpenAI-compatible server (a real aiohttp server on a free port)."""
from __future__ import annotations

import json
import re
from collections.abc import Callable

import openai
import pytest
from aiohttp import web

from demo.agent import (
    FEW_SHOT,
    PROMPTS,
    SYSTEM_PROMPT,
    evaluate,
    evaluate_detailed,
    normalize_answer,
    parse_action,
    run_episode,
    run_tool,
    score,
)
from demo.calculator import CalcError, safe_eval
from demo.tasks import (
    EXAMPLE_LOOKUPS,
    EXAMPLE_PRODUCTS,
    FAMILIES,
    WORD_TEMPLATES,
    Task,
    _mul_key,
    _pool,
    heldout_tasks,
    lookup,
    lookup_table,
    train_tasks,
)

# --- splits ----------------------------------------------------------------------------------------


def _problem_key(task: Task) -> str:
    if task.family == "lookup":
        return task.task_id
    if task.family == "chain":  # held out by the item: its code is never seen in training, whatever the factor
        return task.task_id.split(":", 1)[1].rsplit("*", 1)[0]
    a, b = map(int, task.task_id.rsplit(":", 1)[1].split("*"))
    return _mul_key(a, b)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_train_and_heldout_pools_are_disjoint(family):
    train = {_problem_key(t) for t in _tasks_all(family, "train")}
    heldout = {_problem_key(t) for t in _tasks_all(family, "heldout")}
    assert train and heldout
    assert not train & heldout
    assert 0.1 < len(heldout) / (len(train) + len(heldout)) < 0.3  # about one in five held out


def _tasks_all(family: str, split: str) -> list[Task]:
    pick = train_tasks if split == "train" else heldout_tasks
    return pick(len(_pool(family, split)), 0, family=family)


@pytest.mark.parametrize("family", ["mul2x2", "mul3x2", "mul1x2", "words2x2"])
def test_sampled_splits_are_deterministic_distinct_and_correct(family):
    first = train_tasks(64, seed=3, family=family)
    assert first == train_tasks(64, seed=3, family=family)
    assert first != train_tasks(64, seed=4, family=family)
    assert heldout_tasks(32, seed=3, family=family) == heldout_tasks(32, seed=3, family=family)
    assert len({t.task_id for t in first}) == 64
    for task in first + heldout_tasks(32, family=family):
        a, b = map(int, task.task_id.rsplit(":", 1)[1].split("*"))
        if family == "words2x2":
            template = WORD_TEMPLATES[int(task.task_id.split(":")[1])]
            assert task.prompt == template.format(a=a, b=b)
        else:
            assert task.prompt == f"What is {a} * {b}?"
        assert task.answer == a * b and task.tool == "calc" and task.family == family
        assert a % 10 and b % 10
    assert {t.split for t in first} == {"train"}
    assert {t.split for t in heldout_tasks(8, family=family)} == {"heldout"}


def test_pinned_tasks_do_not_drift():
    # docs/demo-tasks.md reports base success on exactly these tasks; a generator change invalidates it.
    assert [t.task_id for t in heldout_tasks(3)] == ["words2x2:0:75*45", "words2x2:2:65*84", "words2x2:2:76*42"]
    # (the training draws changed once, when the gate split took one problem in ten out of training)
    assert [t.task_id for t in train_tasks(3)] == ["words2x2:0:57*65", "words2x2:3:81*62", "words2x2:3:46*17"]
    assert heldout_tasks(1)[0].prompt == "A box holds 75 rows of 45 eggs. How many eggs are in the box?"


def test_few_shot_examples_are_in_neither_split():
    keys = {_mul_key(a, b) for a, b in EXAMPLE_PRODUCTS}
    for split in ("train", "heldout"):
        assert not keys & {_problem_key(t) for t in _tasks_all("mul2x2", split)}
        assert not {f"lookup:{n.replace(' ', '-')}" for n in EXAMPLE_LOOKUPS} & {
            t.task_id for t in _tasks_all("lookup", split)}


def test_lookup_table_is_fixed_and_tasks_match_it():
    table = lookup_table()
    assert len(table) == 144 and all(100 <= v <= 999 for v in table.values())
    for task in heldout_tasks(5, family="lookup"):
        name = task.prompt.removeprefix("What is the code of the ").removesuffix("?")
        assert task.answer == table[name] and task.tool == "lookup"
    assert lookup("The Silver Otter.") == table["silver otter"]
    assert lookup("silver") is None


def test_asking_for_too_many_tasks_fails():
    with pytest.raises(ValueError):
        heldout_tasks(10_000, family="lookup")
    with pytest.raises(ValueError):
        train_tasks(1, family="division")


# --- the protocol parser and the scorer ------------------------------------------------------------


@pytest.mark.parametrize("text, kind, arg", [
    ("CALC: 37 * 46", "calc", "37 * 46"),
    ("ANSWER: 1702", "answer", "1702"),
    ("  calc:37*46  ", "calc", "37*46"),
    ("Sure! Let me compute.\nCALC: 37 * 46\nRESULT: 1702\nANSWER: 1702", "calc", "37 * 46"),
    ("The final ANSWER: `1702`", "answer", "1702"),
    ("**ANSWER:** 1702", "answer", "1702"),
    ("LOOKUP: silver otter", "lookup", "silver otter"),
    ("ANSWER:", "answer", ""),
    ("CALC:\n37*46", "calc", ""),
])
def test_parse_action_reads_the_first_action_line(text, kind, arg):
    action = parse_action(text)
    assert action is not None and (action.kind, action.arg) == (kind, arg)


@pytest.mark.parametrize("text", ["", None, "1702", "The answer is 1702.", "CALCULATE 37*46", "RESULT: 1702"])
def test_parse_action_without_an_action_line(text):
    assert parse_action(text) is None


def test_score_is_exact_after_light_normalization():
    assert score("1702", 1702) == 1.0
    assert score(" 1702. ", 1702) == 1.0
    assert score("1,702", 1702) == 1.0
    assert score("**1702**", "1702") == 1.0
    assert score("1702 apples", 1702) == 0.0
    assert score("1703", 1702) == 0.0
    assert score("1702.0", 1702) == 0.0
    assert score("17,02", 1702) == 0.0
    assert score(None, 1702) == 0.0
    assert normalize_answer("-1,234!") == "-1234"


# --- the calculator ------------------------------------------------------------------------------


@pytest.mark.parametrize("expr, value", [
    ("37 * 46", 1702), ("37*46", 1702), ("37 x 46", 1702), ("37 × 46", 1702), ("(2 + 3) * 4", 20),
    ("-5 + 2", -3), ("7 / 2", 3.5), ("7 // 2", 3), ("2 ** 10", 1024), ("2^10", 1024), ("1,234 + 1", 1235),
    ("37 * 46 = ?", 1702), ("37 * 46 =", 1702), ("37 * 46?", 1702), ("10 % 4", 2), ("1.5 * 2", 3.0),
])
def test_safe_eval_computes_arithmetic(expr, value):
    assert safe_eval(expr) == value


def test_safe_eval_reads_up_to_equals_only_when_told():
    with pytest.raises(CalcError):
        safe_eval("37 * 46 = 1600 eggs")
    assert safe_eval("37 * 46 = 1600 eggs", ignore_after_equals=True) == 1702
    with pytest.raises(CalcError):
        safe_eval("= 5", ignore_after_equals=True)


@pytest.mark.parametrize("expr", [
    "__import__('os').system('true')", "open('/etc/passwd')", "x * 2", "(1).__class__", "'a' * 3",
    "[1, 2]", "lambda: 1", "True + 1", "1j * 2", "1 / 0", "10 ** 100", "9 ** 9 ** 9", "1 if 1 else 2",
    "", "  ", "37 *", "2 < 3", "1" * 200, "-" * 30 + "1", "1e300 * 1e300", "abs(-1)",
])
def test_safe_eval_refuses_everything_else(expr):
    with pytest.raises(CalcError):
        safe_eval(expr)


def test_run_tool_replies():
    assert run_tool("calc", "37 * 46") == "RESULT: 1702"
    assert run_tool("calc", "7/2") == "RESULT: 3.5"
    assert run_tool("calc", "6/2") == "RESULT: 3"
    assert run_tool("calc", "os.system('x')").startswith("ERROR: ")
    assert run_tool("lookup", "silver otter") == f"RESULT: {lookup_table()['silver otter']}"
    assert run_tool("lookup", "unicorn").startswith("ERROR: ")


def test_prompt_constants():
    assert "CALC:" in SYSTEM_PROMPT and "ANSWER:" in SYSTEM_PROMPT
    assert [m["role"] for m in FEW_SHOT] == ["user", "assistant"] * 4
    assert all(p.opening(train_tasks(1)[0])[-1]["role"] == "user" for p in PROMPTS.values())


# --- whole episodes against a scripted server ------------------------------------------------------


class ScriptedServer:
    """An OpenAI-compatible chat endpoint whose replies come from `policy(messages)`; records requests."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.policy: Callable[[list[dict]], str | int] = lambda messages: "ANSWER: 0"
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        reply = self.policy(body["messages"])
        if isinstance(reply, int):  # an HTTP error status
            return web.json_response({"error": {"message": "scripted failure", "type": "x", "code": reply}},
                                     status=reply)
        return web.json_response({
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                         "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107},
        })

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/rollouts/r1/v1", api_key="unused", max_retries=0)


@pytest.fixture
async def server():
    scripted = ScriptedServer()
    app = web.Application()
    app.router.add_post("/rollouts/{rollout}/v1/chat/completions", scripted.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    scripted.url = f"http://127.0.0.1:{port}"
    try:
        yield scripted
    finally:
        await runner.cleanup()


def script(*replies: str) -> Callable[[list[dict]], str]:
    queue = list(replies)
    return lambda messages: queue.pop(0)


def assert_clean_chat(requests: list[dict], replies: list[str]) -> None:
    """Each request = the previous request + the assistant reply verbatim + exactly one user message."""
    for i in range(1, len(requests)):
        before, after = requests[i - 1]["messages"], requests[i]["messages"]
        assert after[: len(before)] == before
        assert after[len(before)] == {"role": "assistant", "content": replies[i - 1]}
        assert len(after) == len(before) + 2 and after[-1]["role"] == "user"


TASK = Task(task_id="mul2x2:37*46", prompt="What is 37 * 46?", answer=1702)


async def test_correct_tool_use_earns_reward_one(server):
    replies = ["CALC: 37 * 46", "ANSWER: 1702"]
    server.policy = script(*replies)
    async with server.client() as client:
        result = await run_episode(client, "m", TASK)
    assert (result.reward, result.turns, result.answer, result.tool_calls) == (1.0, 2, "1702", 1)
    assert len(server.requests) == 2
    assert server.requests[1]["messages"][-1] == {"role": "user", "content": "RESULT: 1702"}
    assert server.requests[0]["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert server.requests[0]["messages"][-1] == {"role": "user", "content": TASK.prompt}
    assert server.requests[0]["temperature"] == 1.0 and server.requests[0]["model"] == "m"
    assert_clean_chat(server.requests, replies)
    assert result.transcript == server.requests[-1]["messages"] + [{"role": "assistant", "content": replies[-1]}]
    assert (result.prompt_tokens, result.completion_tokens) == (200, 14)


async def test_assistant_text_is_passed_back_verbatim(server):
    replies = ["  Let me use the tool.\nCALC: 37 x 46 \n\nRESULT: 9999\n", " answer: **1,702**.\n"]
    server.policy = script(*replies)
    async with server.client() as client:
        result = await run_episode(client, "m", TASK)
    assert result.reward == 1.0 and result.turns == 2
    assert server.requests[1]["messages"][-1]["content"] == "RESULT: 1702"  # the hallucinated RESULT is ignored
    assert_clean_chat(server.requests, replies)


@pytest.mark.parametrize("replies, answer", [
    (["ANSWER: 1700"], "1700"),  # guessed without the tool
    (["CALC: 37 * 64", "ANSWER: 2368"], "2368"),  # miscopied the operands
    (["CALC: 37 * 46", "ANSWER: 1072"], "1072"),  # miscopied the result
    (["The product is 1702.", "I think so.", "Yes."], None),  # never used the protocol
    (["CALC: 37 * 46", "CALC: 37 * 46", "CALC: 37 * 46"], None),  # ran out of turns
    (["CALC: import os", "ANSWER: 1702 exactly"], "1702 exactly"),  # tool error, then a non-exact answer
])
async def test_anything_else_earns_zero(server, replies, answer):
    server.policy = script(*replies)
    async with server.client() as client:
        result = await run_episode(client, "m", TASK, max_turns=3)
    assert result.reward == 0.0 and result.answer == answer and result.turns == len(replies)
    assert_clean_chat(server.requests, replies)


async def test_reminder_then_tool_error_then_success(server):
    replies = ["I will compute it.", "CALC: 37 * y", "CALC: 37*46", "ANSWER: 1702"]
    server.policy = script(*replies)
    async with server.client() as client:
        result = await run_episode(client, "m", TASK, max_turns=4, max_tokens=20, temperature=0.5)
    assert (result.reward, result.turns, result.tool_calls, result.tool_errors) == (1.0, 4, 1, 1)
    users = [r["messages"][-1]["content"] for r in server.requests[1:]]
    assert users[0].startswith("Reply with one line: CALC:")
    assert users[1].startswith("ERROR: ") and users[2] == "RESULT: 1702"
    assert server.requests[0]["max_tokens"] == 20 and server.requests[0]["temperature"] == 0.5
    assert_clean_chat(server.requests, replies)


async def test_lookup_task_uses_the_lookup_tool(server):
    task = heldout_tasks(1, family="lookup")[0]
    name = task.prompt.removeprefix("What is the code of the ").removesuffix("?")
    replies = ["CALC: 2 + 2", f"LOOKUP: {name}", f"ANSWER: {task.answer}"]
    server.policy = script(*replies)
    async with server.client() as client:
        result = await run_episode(client, "m", task)
    assert (result.reward, result.tool_calls, result.tool_errors) == (1.0, 1, 1)
    assert server.requests[0]["messages"][0]["content"] == PROMPTS["lookup-chat2"].system
    # only the tool the prompt offers runs
    assert server.requests[1]["messages"][-1]["content"] == "ERROR: unknown tool CALC; use LOOKUP"
    assert server.requests[2]["messages"][-1]["content"] == f"RESULT: {task.answer}"
    assert_clean_chat(server.requests, replies)


async def test_calculator_reads_up_to_equals_unless_strict(server):
    replies = ["CALC: 37 * 46 = 1600 eggs", "ANSWER: 1702"]
    server.policy = script(*replies)
    async with server.client() as client:
        result = await run_episode(client, "m", TASK)
        assert result.reward == 1.0 and server.requests[1]["messages"][-1]["content"] == "RESULT: 1702"
        server.policy = script(*replies)
        strict = await run_episode(client, "m", TASK, prompting=PROMPTS["calc-chat2-strict"])
    assert strict.tool_errors == 1 and strict.reward == 1.0  # the answer still counts, however it was found
    assert server.requests[3]["messages"][-1]["content"].startswith("ERROR: ")


def solver(messages: list[dict]) -> str:
    """A scripted policy that uses the protocol correctly on any multiplication task or word problem."""
    last = messages[-1]["content"]
    if last.startswith("RESULT: "):
        return "ANSWER: " + last.removeprefix("RESULT: ")
    a, b = re.findall(r"\d+", last)
    return f"CALC: {a} * {b}"


async def test_evaluate_reports_success_rate(server):
    tasks = heldout_tasks(12)
    server.policy = solver
    async with server.client() as client:
        assert await evaluate(client, "m", tasks, concurrency=4) == 1.0
        server.policy = lambda messages: "ANSWER: 1"
        assert await evaluate(client, "m", tasks) == 0.0

        failing = {json.dumps(tasks[0].prompt)}
        server.policy = lambda messages: 500 if json.dumps(messages[-1]["content"]) in failing else solver(messages)
        stats = await evaluate_detailed(client, "m", tasks)
    assert stats.errors == 1 and stats.success == pytest.approx(11 / 12)
    assert stats.tool_use_rate == pytest.approx(11 / 12) and stats.answer_format_rate == pytest.approx(11 / 12)
    assert stats.mean_turns == 2.0 and isinstance(stats.results[0], openai.APIStatusError)


async def test_chain_task_takes_a_lookup_then_a_calculation_on_its_result(server):
    task = heldout_tasks(1, family="chain")[0]
    name, factor = task.prompt.removeprefix("What is the code of the ").removesuffix("?").rsplit(" times ", 1)
    code = lookup(name)
    assert task.answer == code * int(factor) and task.tool == "chain"
    replies = [f"LOOKUP: {name}", f"CALC: {code} * {factor}", f"ANSWER: {task.answer}"]
    server.policy = script(*replies)
    async with server.client() as client:
        result = await run_episode(client, "m", task)
    assert (result.reward, result.turns, result.tool_calls, result.tool_errors) == (1.0, 3, 2, 0)
    assert server.requests[0]["messages"][0]["content"] == PROMPTS["chain-chat2"].system
    assert [r["messages"][-1]["content"] for r in server.requests[1:]] == [f"RESULT: {code}",
                                                                          f"RESULT: {task.answer}"]
    assert_clean_chat(server.requests, replies)  # each call continues the one before it


async def test_chain_episode_gets_one_turn_to_recover_and_no_more(server):
    task = heldout_tasks(1, family="chain")[0]
    name = task.prompt.removeprefix("What is the code of the ").rsplit(" times ", 1)[0]
    replies = [f"LOOKUP: {name}", "I am not sure.", "CALC: 1 + 1", "CALC: 2 * 2", f"ANSWER: {task.answer}"]
    server.policy = script(*replies)
    async with server.client() as client:
        result = await run_episode(client, "m", task)
    # three steps and one slip: the fifth call, which would have answered, is never made
    assert (result.reward, result.turns, result.answer, len(server.requests)) == (0.0, 4, None, 4)

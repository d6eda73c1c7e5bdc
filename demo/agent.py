"""The demo agent: plain `openai` SDK code with a text tool protocol, the way a user would write it.

The bundled model's chat template ignores `tools`, so the agent does not use native tool calls. It
speaks a line protocol instead (PROTOCOL below), taught by a few worked examples:

    user       What is 37 * 46?
    assistant  CALC: 37 * 46          <- the agent evaluates this with `safe_eval` (no eval())
    user       RESULT: 1702
    assistant  ANSWER: 1702           <- scored against the task's answer: 1.0 exact, else 0.0

Every request is the previous request's messages + the assistant's reply exactly as the model wrote it +
one new user message, so a recording proxy can link each call to the one before it by prefix. The agent
never edits, trims or re-renders what the model wrote; whatever it parses, it parses from a copy.

Point `client.base_url` at the proxy's ``/rollouts/{id}/v1`` to record an episode as one rollout.
"""
from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai

from demo.calculator import CalcError, format_number, safe_eval
from demo.tasks import CALC, CHAIN, EXAMPLE_CHAINS, EXAMPLE_LOOKUPS, EXAMPLE_PRODUCTS, LOOKUP, Task, lookup

DEFAULT_MAX_TURNS = 3
DEFAULT_MAX_TOKENS = 32

PROTOCOL = """\
One action per reply, on its own line:
  CALC: <arithmetic expression>   the agent replies  RESULT: <number>   (or ERROR: <why>)
  LOOKUP: <name>                  the agent replies  RESULT: <code>     (or ERROR: <why>)
  ANSWER: <value>                 ends the episode; reward 1.0 if <value> equals the answer, else 0.0
The first action line in a reply counts; the rest of the reply is ignored. A reply with no action line
gets a reminder. After max_turns model replies without ANSWER the episode ends with reward 0.0."""

REMINDER = {
    CALC: "Reply with one line: CALC: <expression> or ANSWER: <number>",
    LOOKUP: "Reply with one line: LOOKUP: <name> or ANSWER: <number>",
    CHAIN: "Reply with one line: LOOKUP: <name>, CALC: <expression> or ANSWER: <number>",
}
# The tools an episode of each task kind may run; any other action is answered with an ERROR.
TOOLS_OF = {CALC: (CALC,), LOOKUP: (LOOKUP,), CHAIN: (LOOKUP, CALC)}

# The protocol's markers as the proxy's AIR text rules (docs/air.md; `rlproxy demo` passes them to its proxy):
# a reply with a tool action, answered by a user turn starting ERROR:, earns that reply's call a tool_error.
AIR_TEXT_ACTION = r"(?i)\b(?:CALC|LOOKUP)\s*:"  # as _ACTION below reads them (ANSWER is no tool)
AIR_TEXT_ERROR = r"ERROR:"

# --- prompts ---------------------------------------------------------------------------------------

_CALC_RULES = (
    "You answer math questions using a calculator. Never compute in your head.\n"
    "First reply with exactly one line: CALC: <expression>\n"
    "You will receive RESULT: <number>. Then reply with exactly one line: ANSWER: <number>"
)
_LOOKUP_RULES = (
    "You answer questions about item codes using a lookup table. You do not know any codes yourself.\n"
    "First reply with exactly one line: LOOKUP: <item name>\n"
    "You will receive RESULT: <code>. Then reply with exactly one line: ANSWER: <code>"
)
_CHAIN_RULES = (
    "You answer questions about item codes using a lookup table and a calculator. You do not know any codes "
    "yourself and never compute in your head.\n"
    "First reply with exactly one line: LOOKUP: <item name>\n"
    "You will receive RESULT: <code>. Then reply with exactly one line: CALC: <expression>\n"
    "You will receive RESULT: <number>. Then reply with exactly one line: ANSWER: <number>"
)
_DIRECT_RULES = "You answer math questions. Reply with exactly one line: ANSWER: <number>"


def _calc_dialogue(a: int, b: int) -> list[tuple[str, str]]:
    return [("user", f"What is {a} * {b}?"), ("assistant", f"CALC: {a} * {b}"),
            ("user", f"RESULT: {a * b}"), ("assistant", f"ANSWER: {a * b}")]


def _lookup_dialogue(name: str) -> list[tuple[str, str]]:
    code = lookup(name)
    return [("user", f"What is the code of the {name}?"), ("assistant", f"LOOKUP: {name}"),
            ("user", f"RESULT: {code}"), ("assistant", f"ANSWER: {code}")]


def _chain_dialogue(name: str, factor: int) -> list[tuple[str, str]]:
    code = lookup(name)
    return [("user", f"What is the code of the {name} times {factor}?"), ("assistant", f"LOOKUP: {name}"),
            ("user", f"RESULT: {code}"), ("assistant", f"CALC: {code} * {factor}"),
            ("user", f"RESULT: {code * factor}"), ("assistant", f"ANSWER: {code * factor}")]


def _as_text(dialogue: list[tuple[str, str]]) -> str:
    return "\n".join(f"{role}: {content}" for role, content in dialogue)


@dataclass(frozen=True)
class Prompting:
    """How an episode opens: a system prompt, worked examples as real chat turns, whether tools run."""

    name: str
    tool: str  # the task kind it is written for: "calc" or "lookup"
    system: str
    few_shot: tuple[tuple[str, str], ...] = ()  # (role, content) turns placed before the question
    tools: bool = True  # False: a control that forbids tools (shows the task needs them)
    # The calculator reads up to the first '=' ('CALC: 3 * 4 = 15 apples' is 3 * 4); strict: the whole line
    strict_calc: bool = False
    # Model calls before the episode ends unanswered: the task's steps plus one to recover from a slip
    max_turns: int = DEFAULT_MAX_TURNS

    def opening(self, task: Task) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system},
                *({"role": role, "content": content} for role, content in self.few_shot),
                {"role": "user", "content": task.prompt}]


def _prompts() -> dict[str, Prompting]:
    calc2 = [turn for a, b in EXAMPLE_PRODUCTS[:2] for turn in _calc_dialogue(a, b)]
    calc1 = _calc_dialogue(*EXAMPLE_PRODUCTS[0])
    lookup2 = [turn for name in EXAMPLE_LOOKUPS[:2] for turn in _lookup_dialogue(name)]
    chain2 = [turn for name, factor in EXAMPLE_CHAINS for turn in _chain_dialogue(name, factor)]
    direct2 = [turn for a, b in EXAMPLE_PRODUCTS[:2]
               for turn in (("user", f"What is {a} * {b}?"), ("assistant", f"ANSWER: {a * b}"))]
    variants = [
        # worked examples as chat turns (the model sees them in its own chat format)
        Prompting("calc-chat2", CALC, _CALC_RULES, tuple(calc2)),
        Prompting("calc-chat1", CALC, _CALC_RULES, tuple(calc1)),
        Prompting("calc-chat2-strict", CALC, _CALC_RULES, tuple(calc2), strict_calc=True),
        # the same examples written out inside the system prompt; the question is the first user turn
        Prompting("calc-sys2", CALC, _CALC_RULES + "\n\nExamples:\n" + _as_text(calc2)),
        Prompting("calc-sys1", CALC, _CALC_RULES + "\n\nExample:\n" + _as_text(calc1)),
        # the rules alone
        Prompting("calc-zero", CALC, _CALC_RULES),
        Prompting("lookup-chat2", LOOKUP, _LOOKUP_RULES, tuple(lookup2)),
        Prompting("chain-chat2", CHAIN, _CHAIN_RULES, tuple(chain2), max_turns=4),
        # control: no tool, answer directly
        Prompting("direct-chat2", CALC, _DIRECT_RULES, tuple(direct2), tools=False),
    ]
    return {p.name: p for p in variants}


PROMPTS: dict[str, Prompting] = _prompts()
DEFAULT_PROMPTS: dict[str, Prompting] = {CALC: PROMPTS["calc-chat2"], LOOKUP: PROMPTS["lookup-chat2"],
                                         CHAIN: PROMPTS["chain-chat2"]}
SYSTEM_PROMPT: str = DEFAULT_PROMPTS[CALC].system
FEW_SHOT: list[dict[str, str]] = [{"role": r, "content": c} for r, c in DEFAULT_PROMPTS[CALC].few_shot]

# --- the protocol parser ---------------------------------------------------------------------------

_ACTION = re.compile(r"\b(CALC|LOOKUP|ANSWER)\s*:[ \t]*(.*)", re.IGNORECASE)
_WRAPPING = " \t`*\"'"


@dataclass(frozen=True)
class Action:
    kind: str  # "calc", "lookup" or "answer"
    arg: str  # "" when the line names an action but gives nothing after the colon
    line: str


def parse_action(text: str | None) -> Action | None:
    """The first action line in a reply, or None when the reply has none."""
    for line in (text or "").splitlines():
        match = _ACTION.search(line)
        if match:
            return Action(match.group(1).lower(), match.group(2).strip(_WRAPPING), line)
    return None


_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+")


def normalize_answer(value: str) -> str:
    """Outer whitespace/quotes/markdown and a final '.' or '!' dropped, thousands commas removed."""
    value = value.strip(_WRAPPING).rstrip(".!").strip(_WRAPPING)
    if _THOUSANDS.fullmatch(value):
        value = value.replace(",", "")
    return value


def score(answer: str | None, expected: str | int) -> float:
    """1.0 when the normalized answer is exactly the expected value, else 0.0 (no partial credit)."""
    return float(answer is not None and normalize_answer(answer) == str(expected))


def run_tool(kind: str, arg: str, *, ignore_after_equals: bool = False) -> str:
    """The user message that answers one tool action: 'RESULT: ...' or 'ERROR: ...'."""
    if kind == CALC:
        try:
            return f"RESULT: {format_number(safe_eval(arg, ignore_after_equals=ignore_after_equals))}"
        except CalcError as exc:
            return f"ERROR: {exc}"
    if kind == LOOKUP:
        code = lookup(arg)
        return f"RESULT: {code}" if code is not None else "ERROR: no item with that name"
    return f"ERROR: unknown tool {kind.upper()}"


# --- episodes --------------------------------------------------------------------------------------


@dataclass
class EpisodeResult:
    reward: float
    turns: int  # model calls made
    answer: str | None  # the ANSWER value as written, None if the episode ended without one
    transcript: list[dict[str, Any]]  # every message, the last model reply included
    tool_calls: int = 0  # tool actions that returned RESULT
    tool_errors: int = 0  # tool actions that returned ERROR
    prompt_tokens: int = 0  # summed over calls, as the server reported them
    completion_tokens: int = 0
    finish_reasons: list[str | None] = field(default_factory=list)


async def run_episode(
    client: openai.AsyncOpenAI,
    model: str,
    task: Task,
    *,
    temperature: float = 1.0,
    max_turns: int | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    prompting: Prompting | None = None,
) -> EpisodeResult:
    """Run one task to an ANSWER (or max_turns model calls, the prompting's by default); API errors propagate
    to the caller."""
    prompting = prompting or DEFAULT_PROMPTS[task.tool]
    max_turns = max_turns or prompting.max_turns
    tools = TOOLS_OF.get(task.tool, (task.tool,))
    messages: list[dict[str, Any]] = prompting.opening(task)
    result = EpisodeResult(reward=0.0, turns=0, answer=None, transcript=messages)
    for turn in range(1, max_turns + 1):
        response = await client.chat.completions.create(
            model=model, messages=list(messages), temperature=temperature, max_tokens=max_tokens)
        result.turns = turn
        choice = response.choices[0]
        text = choice.message.content or ""
        result.finish_reasons.append(choice.finish_reason)
        if response.usage is not None:
            result.prompt_tokens += response.usage.prompt_tokens
            result.completion_tokens += response.usage.completion_tokens
        messages.append({"role": "assistant", "content": text})  # verbatim, always

        action = parse_action(text)
        if action is not None and action.kind == "answer" and action.arg:
            result.answer = action.arg
            result.reward = score(action.arg, task.answer)
            break
        if turn == max_turns:
            break
        if action is None or not action.arg:
            reply = REMINDER.get(task.tool, REMINDER[CALC])
        elif not prompting.tools:
            reply = "ERROR: no tools here; reply with ANSWER: <number>"
        elif action.kind not in tools:  # only the tools the prompt offers run
            reply = f"ERROR: unknown tool {action.kind.upper()}; use {' or '.join(t.upper() for t in tools)}"
            result.tool_errors += 1
        else:
            reply = run_tool(action.kind, action.arg, ignore_after_equals=not prompting.strict_calc)
            if reply.startswith("RESULT:"):
                result.tool_calls += 1
            else:
                result.tool_errors += 1
        messages.append({"role": "user", "content": reply})
    return result


@dataclass
class EvalStats:
    n: int
    success: float  # mean reward
    mean_turns: float
    tool_use_rate: float  # episodes with at least one tool call that returned RESULT
    answer_format_rate: float  # episodes that ended with an ANSWER line
    errors: int  # episodes whose API call failed (counted as reward 0)
    mean_prompt_tokens: float  # per episode, summed over its calls
    mean_completion_tokens: float
    seconds: float
    results: list[EpisodeResult | BaseException] = field(repr=False, default_factory=list)


async def evaluate_detailed(
    client: openai.AsyncOpenAI, model: str, tasks: list[Task], concurrency: int = 8,
    on_episode: Callable[[], None] | None = None, **episode_kwargs
) -> EvalStats:
    """Run every task once, at most `concurrency` episodes at a time; failed episodes score 0. `on_episode()`
    is called as each episode ends (a progress bar)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> EpisodeResult | BaseException:
        async with gate:
            try:
                return await run_episode(client, model, task, **episode_kwargs)
            except openai.OpenAIError as exc:
                return exc
            finally:
                if on_episode is not None:
                    on_episode()

    began = time.perf_counter()
    results = await asyncio.gather(*(one(t) for t in tasks))
    seconds = time.perf_counter() - began
    done = [r for r in results if isinstance(r, EpisodeResult)]
    n = max(len(tasks), 1)
    m = max(len(done), 1)
    return EvalStats(
        n=len(tasks),
        success=sum(r.reward for r in done) / n,
        mean_turns=sum(r.turns for r in done) / m,
        tool_use_rate=sum(r.tool_calls > 0 for r in done) / n,
        answer_format_rate=sum(r.answer is not None for r in done) / n,
        errors=len(results) - len(done),
        mean_prompt_tokens=sum(r.prompt_tokens for r in done) / m,
        mean_completion_tokens=sum(r.completion_tokens for r in done) / m,
        seconds=seconds,
        results=list(results),
    )


async def evaluate(client: openai.AsyncOpenAI, model: str, tasks: list[Task], concurrency: int = 8,
                   **episode_kwargs) -> float:
    """Success rate (mean reward) of one episode per task."""
    return (await evaluate_detailed(client, model, tasks, concurrency, **episode_kwargs)).success

"""Steady agent traffic through the real `openai` SDK, in a background thread, and the accounting the fault
tests print: calls sent, acknowledged (the whole answer arrived), stored, lost (acknowledged, not stored)."""
from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import anthropic
import openai
import psycopg
import requests

MESSAGES = [{"role": "user", "content": "What is 6 times 7?"}]


@dataclass
class Outcome:
    rollout_id: str
    call_id: str | None = None
    acknowledged: bool = False
    error: str | None = None
    api: str = "chat"


@dataclass
class Traffic:
    """`workers` agents, each its own rollout, cycling through plain and streamed chat, Responses and Messages
    calls every `pause` s."""

    proxy_url: str
    workers: int = 8
    pause: float = 0.05
    timeout: float = 20.0
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> "Traffic":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 10)

    @property
    def acknowledged(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.acknowledged]

    @property
    def errors(self) -> Counter:
        return Counter(o.error for o in self.outcomes if o.error)

    async def _main(self) -> None:
        await asyncio.gather(*(self._agent(f"fault{n:02d}{time.time_ns():x}") for n in range(self.workers)))

    async def _agent(self, rollout_id: str) -> None:
        base_url = f"{self.proxy_url}/rollouts/{rollout_id}"
        client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0,
                                    timeout=self.timeout)  # a retry would hide a failure
        messages = anthropic.AsyncAnthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=self.timeout)
        n = 0
        async with client, messages:
            while not self._stop.is_set():
                api, stream = KINDS[n % len(KINDS)]
                outcome = Outcome(rollout_id, api=f"{api}{' stream' if stream else ''}")
                self.outcomes.append(outcome)
                await self._call(client if api != "messages" else messages, api, outcome, stream)
                n += 1
                await asyncio.sleep(self.pause)

    @staticmethod
    async def _call(client, api: str, outcome: Outcome, stream: bool) -> None:
        try:
            if api == "chat":
                raw = await client.chat.completions.with_raw_response.create(
                    model="stub-model", messages=MESSAGES, max_tokens=8, stream=stream)
            elif api == "responses":
                raw = await client.responses.with_raw_response.create(
                    model="stub-model", input=MESSAGES[0]["content"], max_output_tokens=16, stream=stream)
            else:
                raw = await client.messages.with_raw_response.create(
                    model="stub-model", messages=MESSAGES, max_tokens=8, stream=stream)
            outcome.call_id = raw.headers.get("x-rlproxy-call-id")
            answer = raw.parse()
            if inspect.isawaitable(answer):  # the Anthropic SDK's raw responses parse asynchronously
                answer = await answer
            if not stream:
                assert _finished(api, answer), "no finished answer"
            else:
                events = [event async for event in answer]
                assert events and _finished(api, events[-1]), "the stream ended early"
            outcome.acknowledged = True
        except Exception as exc:  # noqa: BLE001 — every failure a client saw is counted, by kind
            outcome.error = type(exc).__name__


# Each agent cycles through every API the proxy records, plain and streamed.
KINDS = [(api, stream) for api in ("chat", "responses", "messages") for stream in (False, True)]


def _finished(api: str, answer) -> bool:
    """Whether an answer (or a stream's last event) says the call finished."""
    if api == "chat":
        return bool(answer.choices[0].finish_reason)
    if api == "responses":
        return getattr(answer, "type", "response.completed") == "response.completed" and (
            getattr(answer, "response", answer).status == "completed")
    return getattr(answer, "type", None) in ("message", "message_stop")


def settle(proxy_url: str, traffic: Traffic) -> None:
    """Read every rollout back, as an agent would before judging it: `GET /rollouts/{id}` answers once the calls
    the proxy has taken are in the database (the writer may still be catching up after an outage)."""
    for rollout_id in sorted({o.rollout_id for o in traffic.outcomes}):
        requests.get(f"{proxy_url}/rollouts/{rollout_id}", timeout=60).raise_for_status()


def libpq(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


@dataclass
class Tally:
    sent: int
    acknowledged: int
    stored: int
    lost: int
    client_errors: dict
    bad_rollouts: list[str]

    def show(self, title: str) -> None:
        print(f"\n{title}: sent={self.sent} acknowledged={self.acknowledged} stored={self.stored} "
              f"lost={self.lost} client_errors={dict(self.client_errors) or 0}")


def tally(traffic: Traffic, database_url: str) -> Tally:
    """Count the calls against the database; every rollout's calls must be numbered 1..n once each (a call
    stored twice would take two numbers)."""
    acknowledged = traffic.acknowledged
    ids = [o.call_id for o in acknowledged]
    rollouts = sorted({o.rollout_id for o in traffic.outcomes})
    with psycopg.connect(libpq(database_url)) as conn:
        found = {row[0] for row in conn.execute("SELECT id FROM calls WHERE id = ANY(%s)", (ids,))}
        stored = len(found)
        missing = Counter(o.api for o in acknowledged if o.call_id not in found)
        if missing:
            print(f"acknowledged but not stored, by kind: {dict(missing)}")

        bad = []
        for rollout_id in rollouts:
            seqs = [row[0] for row in conn.execute(
                "SELECT seq FROM calls WHERE rollout_id = %s ORDER BY seq", (rollout_id,))]
            count = conn.execute("SELECT call_count FROM rollouts WHERE id = %s", (rollout_id,)).fetchone()
            if seqs != list(range(1, len(seqs) + 1)) or (count and count[0] != len(seqs)):
                bad.append(rollout_id)
    return Tally(len(traffic.outcomes), len(acknowledged), stored, len(acknowledged) - stored, traffic.errors,
                 bad)

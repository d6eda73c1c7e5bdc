"""The calculator agent with CrewAI's `LLM`: the only change for the proxy is `base_url`. The `openai/` prefix
makes CrewAI talk the OpenAI protocol to that URL, whatever the model is called.

    .venv/examples/crewai/bin/python -m examples.crewai_agent --proxy http://127.0.0.1:8400

The episode drives `LLM.call` itself. A CrewAI `Agent` wraps every prompt in its own ReAct template, which a
135M model does not follow; pointed at the proxy the same way, its calls are recorded all the same.
"""
from __future__ import annotations

import os

# CrewAI sends anonymous telemetry and checks for updates unless told not to: nothing here leaves the machine.
for flag in ("CREWAI_DISABLE_TELEMETRY", "CREWAI_DISABLE_TRACKING", "CREWAI_DISABLE_VERSION_CHECK",
             "OTEL_SDK_DISABLED"):
    os.environ.setdefault(flag, "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from crewai import LLM  # noqa: E402 — after the environment above

from demo.tasks import Task  # noqa: E402
from examples.common import (MAX_TOKENS, MAX_TURNS, TEMPERATURE, Outcome, api_key,  # noqa: E402
                             final_reward, main, opening, post_reward, rollout_base_url, tool_reply)


def run_episode(proxy: str, model: str, task: Task, rollout_id: str) -> Outcome:
    llm = LLM(model=f"openai/{model}", base_url=rollout_base_url(proxy, rollout_id), api_key=api_key(),
              temperature=TEMPERATURE, max_tokens=MAX_TOKENS)
    messages = opening(task)
    replies: list[str] = []
    for _ in range(MAX_TURNS):
        text = llm.call(list(messages))
        replies.append(text)
        messages.append({"role": "assistant", "content": text})
        reply = tool_reply(text, task)  # "RESULT: 3375" for "CALC: 75 * 45", None on ANSWER
        if reply is None:
            break
        messages.append({"role": "user", "content": reply})

    reward = final_reward(replies, task)
    post_reward(proxy, rollout_id, task, reward)
    return Outcome(rollout_id, task.task_id, reward, replies)


if __name__ == "__main__":
    main(run_episode, __doc__)

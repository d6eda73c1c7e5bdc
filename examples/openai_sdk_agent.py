"""The calculator agent with the plain `openai` SDK: the only change for the proxy is `base_url`.

    python -m examples.openai_sdk_agent --proxy http://127.0.0.1:8400
"""
from __future__ import annotations

import openai

from demo.tasks import Task
from examples.common import (MAX_TOKENS, MAX_TURNS, TEMPERATURE, Outcome, api_key, final_reward, main,
                             opening, post_reward, rollout_base_url, tool_reply)


def run_episode(proxy: str, model: str, task: Task, rollout_id: str) -> Outcome:
    client = openai.OpenAI(base_url=rollout_base_url(proxy, rollout_id), api_key=api_key())
    messages = opening(task)
    replies: list[str] = []
    for _ in range(MAX_TURNS):
        response = client.chat.completions.create(
            model=model, messages=messages, temperature=TEMPERATURE, max_tokens=MAX_TOKENS)
        text = response.choices[0].message.content or ""
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

"""The calculator agent with the OpenAI Agents SDK (`openai-agents`) on chat completions: the only change for
the proxy is the `AsyncOpenAI` client's `base_url`.

    python -m examples.openai_agents_agent --proxy http://127.0.0.1:8400
"""
from __future__ import annotations

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

from demo.tasks import Task
from examples.common import (MAX_TOKENS, MAX_TURNS, TEMPERATURE, Outcome, api_key, final_reward, main,
                             opening, post_reward, rollout_base_url, tool_reply)

set_tracing_disabled(True)  # traces would be sent to OpenAI; the proxy records every call anyway


async def run_episode(proxy: str, model: str, task: Task, rollout_id: str) -> Outcome:
    client = AsyncOpenAI(base_url=rollout_base_url(proxy, rollout_id), api_key=api_key())
    system, *conversation = opening(task)  # the worked examples and the question become the run's input
    agent = Agent(
        name="calculator",
        instructions=system["content"],
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=ModelSettings(temperature=TEMPERATURE, max_tokens=MAX_TOKENS),
    )
    history: list = conversation
    replies: list[str] = []
    for _ in range(MAX_TURNS):
        result = await Runner.run(agent, history)  # no tools, so one model call per run
        replies.append(result.final_output)
        history = result.to_input_list()  # the input plus the model's reply
        reply = tool_reply(result.final_output, task)  # "RESULT: 3375" for "CALC: 75 * 45"; None on ANSWER
        if reply is None:
            break
        history.append({"role": "user", "content": reply})

    reward = final_reward(replies, task)
    post_reward(proxy, rollout_id, task, reward)
    return Outcome(rollout_id, task.task_id, reward, replies)


if __name__ == "__main__":
    main(run_episode, __doc__)

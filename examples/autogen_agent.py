"""The calculator agent with AutoGen (`autogen-agentchat` + `autogen-ext`): the only change for the proxy is
the model client's `base_url`. A model OpenAI does not know needs `model_info` saying what it can do.

    .venv/examples/autogen/bin/python -m examples.autogen_agent --proxy http://127.0.0.1:8400
"""
from __future__ import annotations

from autogen_agentchat.agents import AssistantAgent
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import AssistantMessage, ModelFamily, ModelInfo, UserMessage
from autogen_ext.models.openai import OpenAIChatCompletionClient

from demo.tasks import Task
from examples.common import (MAX_TOKENS, MAX_TURNS, TEMPERATURE, Outcome, api_key, final_reward, main,
                             opening, post_reward, rollout_base_url, tool_reply)

SMALL_MODEL = ModelInfo(vision=False, function_calling=False, json_output=False, structured_output=False,
                        family=ModelFamily.UNKNOWN)


async def run_episode(proxy: str, model: str, task: Task, rollout_id: str) -> Outcome:
    client = OpenAIChatCompletionClient(
        model=model, base_url=rollout_base_url(proxy, rollout_id), api_key=api_key(), model_info=SMALL_MODEL,
        temperature=TEMPERATURE, max_tokens=MAX_TOKENS,
        include_name_in_message=False)  # send messages exactly as the other examples do
    system, *worked_examples, question = opening(task)
    few_shot = [UserMessage(content=m["content"], source="user") if m["role"] == "user"
                else AssistantMessage(content=m["content"], source="calculator") for m in worked_examples]
    agent = AssistantAgent("calculator", model_client=client, system_message=system["content"],
                           model_context=UnboundedChatCompletionContext(initial_messages=few_shot))
    message = question["content"]
    replies: list[str] = []
    for _ in range(MAX_TURNS):
        result = await agent.run(task=message)  # the agent keeps the conversation between runs
        replies.append(result.messages[-1].content)
        message = tool_reply(replies[-1], task)  # "RESULT: 3375" for "CALC: 75 * 45", None on ANSWER
        if message is None:
            break
    await client.close()

    reward = final_reward(replies, task)
    post_reward(proxy, rollout_id, task, reward)
    return Outcome(rollout_id, task.task_id, reward, replies)


if __name__ == "__main__":
    main(run_episode, __doc__)

"""The calculator agent with LangChain's `ChatOpenAI`: the only change for the proxy is `base_url`.

    python -m examples.langchain_agent --proxy http://127.0.0.1:8400
"""
from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI

from demo.tasks import Task
from examples.common import (MAX_TOKENS, MAX_TURNS, TEMPERATURE, Outcome, api_key, final_reward, main,
                             opening, post_reward, rollout_base_url, tool_reply)

MESSAGE = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}


def run_episode(proxy: str, model: str, task: Task, rollout_id: str) -> Outcome:
    llm = ChatOpenAI(base_url=rollout_base_url(proxy, rollout_id), api_key=api_key(), model=model,
                     temperature=TEMPERATURE, max_tokens=MAX_TOKENS)
    messages = [MESSAGE[m["role"]](content=m["content"]) for m in opening(task)]
    replies: list[str] = []
    for _ in range(MAX_TURNS):
        answer = llm.invoke(messages)  # an AIMessage; it goes back into the history as it is
        replies.append(answer.content)
        messages.append(answer)
        reply = tool_reply(answer.content, task)  # "RESULT: 3375" for "CALC: 75 * 45", None on ANSWER
        if reply is None:
            break
        messages.append(HumanMessage(content=reply))

    reward = final_reward(replies, task)
    post_reward(proxy, rollout_id, task, reward)
    return Outcome(rollout_id, task.task_id, reward, replies)


if __name__ == "__main__":
    main(run_episode, __doc__)

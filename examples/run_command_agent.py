"""An agent for `rlproxy run --command`: any program, given the rollout through its environment (docs/run.md).
It prints its reward as its last line; it could instead POST it to $RLPROXY_REWARD_URL (a posted reward wins).

    rlproxy run --tasks examples/run_tasks.jsonl --command "python examples/run_command_agent.py" \\
        --env-map QUESTION=question --env-map ANSWER=answer
"""
from __future__ import annotations

import os
import re

from openai import OpenAI


def main() -> None:
    client = OpenAI()  # reads OPENAI_BASE_URL and OPENAI_API_KEY: the rollout's base URL and the proxy's key
    reply = client.chat.completions.create(
        model=os.environ["RLPROXY_MODEL"], max_tokens=12, temperature=1.0,
        messages=[{"role": "user", "content": os.environ["QUESTION"]}])
    text = reply.choices[0].message.content or ""
    print(f"reply: {text!r}")
    found = re.search(r"-?\d+(?:\.\d+)?", text)
    print(1.0 if found and found.group() == os.environ["ANSWER"] else 0.0)  # the last line: the reward


if __name__ == "__main__":
    main()

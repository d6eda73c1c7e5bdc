"""An Agent Lightning v1 agent, written as that project's GSM8K and Calc-X examples are: a class with `run()`,
configured only by environment variables its rollout controller sets: `AGL_OPENAI_BASE_URL` (an OpenAI base
URL ending in /v1), `AGL_EVENT_URL`, `AGL_KEY`, and the task's fields mapped by the data file's env map
(here QUESTION and ANSWER). It asks the model "auto" and reports its reward as an event. Nothing in it knows
about rlproxy:

    rlproxy run --tasks examples/run_tasks.jsonl --agent-class examples.agl_calc_agent:CalcAgent \\
        --env-map QUESTION=question --env-map ANSWER=answer
"""
from __future__ import annotations

import json
import os
import re
import urllib.request

from openai import OpenAI

SYSTEM = "You are a careful calculator. Reply with the number only."


class CalcAgent:
    def __init__(self) -> None:
        self.client = OpenAI(base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"])

    def compute_reward(self, reply: str, answer: str) -> float:
        found = re.search(r"-?\d+(?:\.\d+)?", reply)
        return 1.0 if found and found.group() == answer else 0.0

    def emit(self, event_type: str, data: dict) -> None:
        request = urllib.request.Request(
            os.environ["AGL_EVENT_URL"], data=json.dumps({"event_type": event_type, "data": data}).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {os.environ['AGL_KEY']}"},
            method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:  # raises unless the answer is 2xx
            if not 200 <= response.status < 300:
                raise RuntimeError(f"event {event_type} refused: {response.status}")

    def run(self) -> None:
        question, answer = os.environ["QUESTION"], os.environ["ANSWER"]
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        completion = self.client.chat.completions.create(model="auto", messages=messages, max_tokens=16,
                                                         temperature=1.0)
        reply = completion.choices[0].message.content or ""
        self.emit("message", {"role": "assistant", "content": reply})
        self.emit("reward", {"value": self.compute_reward(reply, answer)})

"""Agents the `rlproxy run` tests name with `--agent`: each shows one way an attempt can end."""
from __future__ import annotations

import time
from pathlib import Path

from openai import APIStatusError, OpenAI


def _client(config) -> OpenAI:
    return OpenAI(base_url=config.openai_base_url, api_key=config.api_key, max_retries=0)


def engine_down_once(task: dict, config) -> float:
    """The engine fails this task's first attempt (a 503 before any answer); the next try gets answers."""
    marker = Path(task["marker_dir"]) / f"{task['id']}-{config.rollout_id}"
    seen = list(Path(task["marker_dir"]).glob(f"{task['id']}-*"))
    marker.touch()
    extra = {"stub_status": 503} if not seen else {}
    _client(config).chat.completions.create(model=config.model, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4, extra_body=extra)
    return 1.0


def own_bug(task: dict, config) -> float:
    """The agent's own failure after its model call was answered: never tried again."""
    _client(config).chat.completions.create(model=config.model, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4)
    raise KeyError("the agent's own bug")


def refused_by_engine(task: dict, config) -> float:
    """Every try meets a broken engine: tried `--retries` more times, then given up as infrastructure."""
    try:
        _client(config).chat.completions.create(model=config.model, max_tokens=4, extra_body={"stub_status": 502},
                                                messages=[{"role": "user", "content": "hi"}])
    except APIStatusError as exc:
        raise RuntimeError(f"engine said {exc.status_code}") from None
    return 1.0


def stuck(task: dict, config) -> float:
    """A sync agent that never comes back in time (its thread cannot be stopped, only left behind)."""
    time.sleep(20)
    return 1.0


class DumpsItsEnvironment:
    """An Agent Lightning style agent class that writes the environment it was started with to $DUMP_TO."""

    def run(self) -> None:
        import json
        import os

        Path(os.environ["DUMP_TO"]).write_text(json.dumps(dict(os.environ)))

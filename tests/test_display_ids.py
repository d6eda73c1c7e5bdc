"""Task ids are free text, but shown as text (logs, `rlproxy run`'s lines, the web view): none may hold a C0 or C1
control, a format character (U+202E turns what follows around, so one id displays as another; U+200B is
invisible) or a separator other than the space. The proxy refuses them in the route's format (422 on POST
/rollouts, 400 on a call's X-Task-Id) and the runner before it opens a rollout."""
from __future__ import annotations

import uuid

import pytest
import requests

from runner.errors import TaskDataError
from runner.task_data import task_id
from testkit.stub_engine import BASE_MODEL

DISPLAY_TRICKS = ["exam\u202eple", "zero\u200bwidth", "c1\u0085next", "csi\u009b31m", "line\u2028break",
                  "no\u00a0break"]
CHAT = {"model": BASE_MODEL, "messages": [{"role": "user", "content": "What is 6*7?"}]}


@pytest.mark.parametrize("value", DISPLAY_TRICKS)
def test_a_task_id_that_would_change_how_text_shows_is_refused(proxy_url, value):
    created = requests.post(f"{proxy_url}/rollouts", json={"task_id": value}, timeout=10)
    assert created.status_code == 422, created.text
    assert "task id holds" in created.json()["error"]["message"]
    called = requests.post(f"{proxy_url}/rollouts/{uuid.uuid4().hex}/v1/chat/completions", json=CHAT,
                           headers={"X-Task-Id": value.encode()}, timeout=10)
    assert called.status_code == 400, called.text
    assert called.json()["error"]["param"] == "task" and "task id holds" in called.json()["error"]["message"]
    with pytest.raises(TaskDataError, match="the task id holds"):
        task_id(value)


def test_task_ids_of_any_script_with_spaces_are_taken(proxy_url):
    for value in ("gsm8k/train/17", "échecs n° 3", "算数 12"):
        assert requests.post(f"{proxy_url}/rollouts", json={"task_id": value}, timeout=10).status_code == 201
        assert task_id(value) == value

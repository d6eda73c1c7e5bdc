"""`--agent module:function`: the function run for each attempt in a process of its own (runner/function_host.py),
as any agent program is: confined where the run confines its agents (runner/confine.py), as --agent-user where
one is named, ended with its attempt. Run in the runner's own process (as `runner.Runner` runs a function handed
to it), the agent's code, and whatever code its model wrote that it runs, could read the runner's key in its
memory and environment, its journal and every task; a function named on the command line never is.

It is called as before, `function(task, client_config)`, sync or async; what it returns is the attempt's reward
(None: it posted its own or none) and an exception it raises the attempt's error, as its type and message. It
also gets the rollout's variables (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, ...: docs/run.md), so a client made with
no arguments calls the rollout, and the runner's variables it was given with --pass-env; not the runner's others."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from core.checks import reward_problem
from runner import confine
from runner.agents import AgentResult, ClientConfig, failure, rollout_env, run_process
from runner.environment import inherited
from runner.hosting import check_in_host
from runner.identity import AgentUser
from runner.task_data import task_json, task_variables

HOST = "runner.function_host"
RESULT = "result.json"


class HostedFunctionAgent:
    def __init__(self, spec: str, pass_env: tuple[str, ...] = (), user: AgentUser | None = None) -> None:
        """Imported once before the run in a process of its own, as each attempt will import it: a module that
        cannot be imported, or a name that is not callable, stops the run before it starts."""
        # the runner's PYTHONPATH too: the host is the runner's own module, and the agent's is found the same way
        self.inherit = inherited(pass_env, also=("PYTHONPATH",))
        check_in_host(HOST, spec, "--agent", self.inherit)
        self.spec, self.user = spec, user

    def check_task(self, task: Any) -> None:
        task_json(task)

    async def run(self, task: dict[str, Any], config: ClientConfig, env: dict[str, str]) -> AgentResult:
        given = f'{{"task": {task_json(task)}, "config": {json.dumps(config.as_dict())}}}'.encode()
        with tempfile.TemporaryDirectory(prefix="rlproxy-task-") as folder:
            variables = {**self.inherit, **env, **rollout_env(config), **task_variables(task, Path(folder)),
                         **(self.user.variables() if self.user else {}), **confine.fresh_home(Path(folder))}
            if self.user is not None:  # its folder alone, writable by it: the result is written there
                self.user.give(Path(folder))
            code, _, err = await run_process([sys.executable, "-m", HOST, self.spec, str(Path(folder) / RESULT)],
                                             variables, stdin=given, user=self.user)
            outcome = _read(Path(folder) / RESULT)
        if outcome is None or not isinstance(outcome, dict):  # killed, or its process ended before it answered
            return AgentResult(error=failure(code, err))
        if "error" in outcome:
            return AgentResult(error=str(outcome["error"]))
        value = outcome.get("reward")
        if value is None:
            return AgentResult(None)
        if problem := reward_problem(value):  # the proxy's own rule: NaN or 1e300 fails this attempt, not the run
            return AgentResult(error=f"ValueError: {self.spec} returned {value!r}: {problem}")
        return AgentResult(float(value))


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None

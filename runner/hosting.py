"""What the two agent hosts share (runner/agl_host.py for an agent class, runner/function_host.py for an `--agent`
function): each imports the agent's module in a process of its own, found from where the run was started, and
first checks it can (`--check SPEC`: one line on standard error and exit status 2 when it cannot), so that a bad
name stops the run before any attempt, without the agent's module ever being imported into the runner."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from runner.errors import RunInputError


def host_main(argv: list[str], load: Callable[[str], Any], run: Callable[[list[str]], int]) -> int:
    """A host's `main`: `--check SPEC` imports it alone (`load`); anything else is `run`'s."""
    if os.getcwd() not in sys.path:  # the agent's module is found from where the run was started
        sys.path.insert(0, os.getcwd())
    if argv[0] == "--check":
        try:
            load(argv[1])
        except RunInputError as exc:
            print(exc, file=sys.stderr)
            return 2
        return 0
    return run(argv)


def check_in_host(host: str, spec: str, flag: str, env: dict[str, str]) -> None:
    """`python -m HOST --check SPEC` in `env`, as each attempt will import it; RunInputError with its line."""
    done = subprocess.run([sys.executable, "-m", host, "--check", spec], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise RunInputError(lines[-1] if lines else f"{flag} {spec!r}: exit status {done.returncode}")

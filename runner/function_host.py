"""`python -m runner.function_host module:function RESULT`: one attempt of an `--agent` function, in a process of
its own (so it is confined, and runs as --agent-user, as any agent program is: runner/confine.py), called as
the runner used to call it in its own process: `function(task, client_config)`, awaited when that gives an
awaitable. The task and the client configuration come as one JSON object on standard input; what it returned
(`{"reward": value}`) or the exception that ended it (`{"error": "Type: message"}`) is written to RESULT, a
file in the attempt's own folder (its standard output stays its own, for its prints).

`--check module:function` only imports it, in the environment it will run in: its one line on standard error
and exit status 2 say why it cannot be used."""
from __future__ import annotations

import asyncio
import inspect
import json
import numbers
import sys
from pathlib import Path
from typing import Any

from runner.agents import ClientConfig, import_target
from runner.errors import RunInputError
from runner.hosting import host_main


def load(spec: str):
    function = import_target(spec, "--agent")
    if not callable(function):
        raise RunInputError(f"--agent {spec!r} is not callable")
    return function


def call(function, task: Any, config: ClientConfig) -> Any:
    value = function(task, config)
    if inspect.isawaitable(value):
        async def settle() -> Any:  # a coroutine, or another awaitable, run to its end on a loop of its own
            return await value
        value = asyncio.run(settle())
    if isinstance(value, numbers.Real) and not isinstance(value, bool):  # numpy's numbers too, as the runner took
        value = float(value)
    return value


def attempt(argv: list[str]) -> int:
    spec, result = argv
    given = json.loads(sys.stdin.buffer.read())
    function = load(spec)
    try:
        outcome = {"reward": call(function, given["task"], ClientConfig(**given["config"]))}
    # SystemExit too: an agent's `sys.exit()` (or its argparse refusing the host's argv) ends its attempt, with
    # its message, as it did in the runner; KeyboardInterrupt raised by its own code likewise
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 — reported as the attempt's error
        outcome = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        text = json.dumps(outcome, default=repr)  # NaN is written as NaN: the runner refuses it as a reward
    except ValueError as exc:  # a value that holds itself
        text = json.dumps({"error": f"ValueError: the function's result cannot be written: {exc}"})
    Path(result).write_text(text, encoding="utf-8")
    return 0 if "reward" in outcome else 1


def main(argv: list[str]) -> int:
    return host_main(argv, load, attempt)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

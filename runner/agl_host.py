"""`python -m runner.agl_host module:Class`: one Agent Lightning v1 agent run, as its controller runs one,
`Class().run()` (awaited when it is a coroutine), in this process; the exit status says whether it raised."""
from __future__ import annotations

import asyncio
import inspect
import os
import sys


def main(spec: str) -> None:
    if os.getcwd() not in sys.path:  # the agent's module is found from where the run was started
        sys.path.insert(0, os.getcwd())
    from runner.agents import import_target

    outcome = import_target(spec, "--agent-class")().run()
    if inspect.isawaitable(outcome):
        asyncio.run(outcome)


if __name__ == "__main__":
    main(sys.argv[1])

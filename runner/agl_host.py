"""`python -m runner.agl_host module:Class`: one Agent Lightning v1 agent run, as its controller runs one,
`Class().run()` (awaited when it is a coroutine), in this process; the exit status says whether it raised.

`--check` only imports the class, in the environment it will run in (such modules may read their variables
when imported): its one line on standard error and exit status 2 say why it cannot be used."""
from __future__ import annotations

import asyncio
import inspect
import sys

from runner.agents import import_target
from runner.errors import RunInputError
from runner.hosting import host_main


def load(spec: str):
    cls = import_target(spec, "--agent-class")
    if not inspect.isclass(cls) or not callable(getattr(cls, "run", None)):
        raise RunInputError(f"--agent-class {spec!r} is not a class with a run() method")
    return cls


def attempt(argv: list[str]) -> int:
    outcome = load(argv[0])().run()
    if inspect.isawaitable(outcome):
        asyncio.run(outcome)
    return 0


def main(argv: list[str]) -> int:
    return host_main(argv, load, attempt)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

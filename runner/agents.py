"""The three ways to name the agent, each run once per attempt with the rollout's URLs:

- a Python function `(task, client_config) -> float | None`, sync or async (`--agent module:function`): in a
  process of its own (runner/function_agent.py), as programs are; one handed to `runner.Runner` in process runs
  in the runner (FunctionAgent: the caller's own code, never confined);
- a program, with the URLs and the task in its environment (`--command "python my_agent.py"`);
- an Agent Lightning v1 agent class, unmodified, in its own process (`--agent-class module:Class`).

An agent's result is what it says the reward is (None: it posted its own, or none) or the error that ended it."""
from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import re
import signal
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from core.checks import reward_problem
from runner import confine
from runner.confine_landlock import restrict_self
from runner.environment import inherited
from runner.errors import AttemptError, RunInputError
from runner.hosting import check_in_host
from runner.identity import AgentUser
from runner.leftovers import preexec, watch_group
from runner.task_data import task_json, task_variables

NUMBER_TAIL = 2000  # bytes of a program's output kept for its last line and the log
PIPE_GRACE_S = 5.0  # after a program ended, how long its output may take to be read to its end


@dataclass(frozen=True)
class ClientConfig:
    """What an agent is given for one attempt."""

    openai_base_url: str  # ends in /v1: every call through it is recorded into the rollout
    anthropic_base_url: str  # the same rollout for Anthropic's clients (they add /v1/messages)
    rollout_id: str
    reward_url: str  # POST {"rollout_id", "reward"} here (the proxy's /reward)
    event_url: str  # or Agent Lightning's event body here
    api_key: str  # the rollout's own token (runner/attempt.py): good for this rollout alone
    model: str  # the model name to ask for ("auto": the rollout's policy)
    task_id: str
    eval: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AgentResult:
    reward: float | None = None
    error: str | None = None  # the agent failed (its own exception or exit status)


def import_target(spec: str, flag: str) -> Any:
    """`module:name` imported from the working directory first, as `python -m` would; bad input otherwise."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise RunInputError(f"{flag} {spec!r}: expected module:name")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)  # loads user code: the agent the user named
    except Exception as exc:  # noqa: BLE001 — the import's own error, in one line
        said = f"{flag} {spec!r}: cannot import {module_name} ({type(exc).__name__}: {exc})"
        if module_name.endswith(".py") or "/" in module_name:  # a file's name or path, not a module's
            suggested = module_name.removesuffix(".py").removeprefix("./").replace("/", ".")
            what = "module:Class" if flag == "--agent-class" else "module:function"
            said += f"; name it {what}, without .py (e.g. {suggested}:{name})"
        raise RunInputError(said) from None
    target = module
    for part in name.split("."):
        if not hasattr(target, part):
            raise RunInputError(f"{flag} {spec!r}: {module_name} has no {name!r}")
        target = getattr(target, part)
    return target


def in_thread(function: Callable, *args: Any) -> asyncio.Future:
    """`function(*args)` in a daemon thread of its own: a sync agent stuck past its timeout cannot hold up the
    other attempts (one thread each) nor the runner's exit (a pool's threads are joined at exit)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():  # cancelled by the attempt's timeout: nobody waits for it any more
            future.set_exception(error) if error is not None else future.set_result(result)

    def target() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (function(*args), None)
        except BaseException as exc:  # noqa: BLE001 — handed to the waiting attempt
            outcome = (None, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the run is over (its loop closed)
            pass

    threading.Thread(target=target, name="agent", daemon=True).start()
    return future


def _reward(value: Any, source: str) -> float:
    if problem := reward_problem(value):  # the proxy's own rule: NaN or 1e300 fails this attempt, not the run
        raise ValueError(f"{source} returned {value!r}: {problem}")
    return float(value)


class FunctionAgent:
    """A function `(task, client_config) -> reward | None`, sync or async: named on the command line
    (`imported`), or handed to `runner.Runner` in process."""

    def __init__(self, function: Callable, name: str | None = None) -> None:
        self.function = function
        self.spec = name or getattr(function, "__qualname__", repr(function))  # names it in errors

    @classmethod
    def imported(cls, spec: str) -> FunctionAgent:
        function = import_target(spec, "--agent")
        if not callable(function):
            raise RunInputError(f"--agent {spec!r} is not callable")
        return cls(function, spec)

    async def run(self, task: dict[str, Any], config: ClientConfig, env: dict[str, str]) -> AgentResult:
        try:
            if inspect.iscoroutinefunction(self.function):
                value = await self.function(task, config)
            else:  # in a thread, so the other attempts go on while it waits for the model
                value = await in_thread(self.function, task, config)
                if inspect.isawaitable(value):
                    value = await value
            return AgentResult(None if value is None else _reward(value, self.spec))
        except asyncio.CancelledError:
            raise
        # SystemExit too: an agent's `sys.exit()` (or its argparse refusing the runner's argv) ends its attempt,
        # not the run; KeyboardInterrupt raised by its own code likewise (Ctrl-C reaches the run as a cancel)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 — logged with the attempt
            return AgentResult(error=f"{type(exc).__name__}: {exc}")


# A reward as a program prints it: a decimal number (JSON's, with a leading + and digits before or after the
# point), not whatever Python's float() takes ("1_0" is ten, "١" Arabic-Indic one, "nan" handled below).
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf|infinity)", re.ASCII | re.IGNORECASE)
# Terminal escape sequences (colours, cursor moves): a program writing "\x1b[32m1\x1b[0m" printed 1
ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")


def last_number(output: bytes) -> float | None:
    """The number on the last line of a program's output; None when there is none. A number the proxy would not
    take as a reward (nan, inf, 1e309, 5e6) is AttemptError: that attempt fails with the reason."""
    lines = ESCAPES.sub("", output.decode(errors="replace")).strip().splitlines()
    last = lines[-1].strip() if lines else ""
    if not NUMBER.fullmatch(last):
        return None
    value = float(last)
    if problem := reward_problem(value):
        raise AttemptError(f"the program's last line, {last[:40]!r}, is not a reward: {problem}")
    return value


async def run_process(argv: list[str] | str, env: dict[str, str], *, cwd: str | None = None,
                      stdin: bytes | None = None, user: AgentUser | None = None,
                      confined: bool = True) -> tuple[int, bytes, bytes]:
    """Run a program to its end in its own process group with exactly the environment `env` (runner/environment.py
    makes an agent's), `stdin` its standard input (else none); cancelling the attempt (its timeout) kills the
    group, so nothing it started outlives it, nor the runner (runner/leftovers.py: it dies with the runner); `user`
    (--agent-user) is whom it runs as; `confined` (an agent's program, not one of the runner's own tools): kept
    from the runner's files where the run confines its agents (runner/confine.py). No descriptor of the runner's
    is inherited (close_fds). A program that cannot be started fails its attempt (AttemptError), never the run."""
    spawn = asyncio.create_subprocess_shell if isinstance(argv, str) else asyncio.create_subprocess_exec
    args = [argv] if isinstance(argv, str) else argv
    program = "/bin/sh" if isinstance(argv, str) else argv[0]
    try:
        ruleset, env = confine.ruleset_for(argv, env, cwd) if confined else (None, env)
    except OSError as exc:
        raise AttemptError(f"cannot confine {program}: {exc.strerror}") from None
    # dies with the runner, in the run's cgroup (runner/leftovers.py); then confined, its last step before exec
    joined = preexec(user)

    def before_exec() -> None:
        joined()
        if ruleset is not None:
            restrict_self(ruleset)

    try:
        process = await spawn(*args, env=env, cwd=cwd,
                              stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
                              stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
                              close_fds=True, preexec_fn=before_exec)
    except OSError as exc:  # E2BIG: "Argument list too long"; a program that is not there
        raise AttemptError(f"cannot start {program}: {exc.strerror}") from None
    except ValueError as exc:  # a NUL or unencodable text in an argument or the environment
        raise AttemptError(f"cannot start {program}: {exc}") from None
    finally:
        if ruleset is not None:
            os.close(ruleset)
    watch_group(process.pid, began=True)
    feeding = asyncio.ensure_future(_feed(process.stdin, stdin)) if stdin is not None else None
    # tasks, not one gather: a run stopped by a signal cancels every task, and a gather whose child was cancelled
    # would hold a CancelledError nobody retrieves (logged with a traceback at exit)
    reading = [asyncio.ensure_future(_tail(process.stdout)), asyncio.ensure_future(_tail(process.stderr))]
    try:
        await _exited(process)
    except asyncio.CancelledError:
        for reader in reading:
            reader.cancel()
        raise
    finally:  # ended or cancelled (its timeout): what it started in its group ends with it, and the pipes close
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        watch_group(process.pid, began=False)
        if feeding is not None:
            feeding.cancel()
    try:
        out, err = await asyncio.wait_for(asyncio.gather(*reading), PIPE_GRACE_S)
    except asyncio.TimeoutError:  # a process that left the group (setsid) still holds a pipe
        out = err = b""
    return process.returncode, out, err


async def _exited(process: asyncio.subprocess.Process) -> int:
    """The exit status, as soon as the program itself ended: `process.wait()` may also wait for its pipes to
    close (Python 3.12), which a program it left running in the background would hold open."""
    while process.returncode is None:
        await asyncio.sleep(0.05)
    return process.returncode


async def _feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    try:
        pipe.write(data)
        await pipe.drain()
        pipe.close()
    except (BrokenPipeError, ConnectionResetError):  # it did not read all of its input: its own business
        pass


async def _tail(stream: asyncio.StreamReader) -> bytes:
    """The last NUMBER_TAIL bytes a program wrote, read as it writes (a program printing gigabytes costs no more
    memory than that)."""
    kept = b""
    while chunk := await stream.read(1 << 16):
        kept = (kept + chunk)[-NUMBER_TAIL:]
    return kept


def failure(code: int, err: bytes) -> str:
    tail = err.decode(errors="replace").strip().splitlines()
    return f"exit status {code}" + (f": {tail[-1]}" if tail else "")


def rollout_env(config: ClientConfig) -> dict[str, str]:
    """The rollout's variables `--command` programs and `--verify` get (docs/run.md lists them): the agent's key
    under the names its clients read, never as the runner's own `RLPROXY_API_KEY`."""
    return {
        "OPENAI_BASE_URL": config.openai_base_url, "OPENAI_API_KEY": config.api_key,
        "ANTHROPIC_BASE_URL": config.anthropic_base_url, "ANTHROPIC_API_KEY": config.api_key,
        "RLPROXY_REWARD_URL": config.reward_url, "RLPROXY_EVENT_URL": config.event_url,
        "RLPROXY_ROLLOUT_ID": config.rollout_id, "RLPROXY_TASK_ID": config.task_id,
        "RLPROXY_MODEL": config.model, "RLPROXY_EVAL": "1" if config.eval else "0",
    }


class CommandAgent:
    """A program run through the shell, with the rollout and the task in its environment (the task also in a
    file): task values reach it only as the values of variables, never in its command line."""

    def __init__(self, command: str, pass_env: tuple[str, ...] = (), user: AgentUser | None = None) -> None:
        self.command, self.pass_env, self.user = command, pass_env, user

    def check_task(self, task: Any) -> None:
        task_json(task)

    async def run(self, task: dict[str, Any], config: ClientConfig, env: dict[str, str]) -> AgentResult:
        with tempfile.TemporaryDirectory(prefix="rlproxy-task-") as folder:
            variables = {**inherited(self.pass_env), **env, **rollout_env(config),
                         **task_variables(task, Path(folder)), **(self.user.variables() if self.user else {}),
                         **confine.fresh_home(Path(folder))}
            if self.user is not None:  # its task alone, readable by it
                self.user.give(Path(folder))
            code, out, err = await run_process(self.command, variables, user=self.user)
        if code != 0:
            return AgentResult(error=failure(code, err))
        return AgentResult(last_number(out))


class ClassAgent:
    """An Agent Lightning v1 agent class: `Class().run()` in a fresh process (runner/agl_host.py) with the
    three variables its controller sets, `AGL_OPENAI_BASE_URL`, `AGL_EVENT_URL` and `AGL_KEY`."""

    def __init__(self, spec: str, check_env: dict[str, str], pass_env: tuple[str, ...] = (),
                 user: AgentUser | None = None) -> None:
        """Imported once before the run in a process of its own, with `check_env` (the AGL variables), as each
        attempt will import it: the module is not imported into the runner."""
        # the runner's PYTHONPATH too: the host is the runner's own module, and the agent's is found the same way
        self.inherit = inherited(pass_env, also=("PYTHONPATH",))
        check_in_host("runner.agl_host", spec, "--agent-class", {**self.inherit, **check_env})
        self.spec, self.user = spec, user

    def check_task(self, task: Any) -> None:
        task_json(task)

    async def run(self, task: dict[str, Any], config: ClientConfig, env: dict[str, str]) -> AgentResult:
        agl = {"AGL_OPENAI_BASE_URL": config.openai_base_url, "AGL_EVENT_URL": config.event_url,
               "AGL_KEY": config.api_key}
        with tempfile.TemporaryDirectory(prefix="rlproxy-task-") as folder:  # the task, for fields too large to map
            variables = {**self.inherit, **env, **agl, **task_variables(task, Path(folder)),
                         **(self.user.variables() if self.user else {}), **confine.fresh_home(Path(folder))}
            if self.user is not None:
                self.user.give(Path(folder))
            code, _, err = await run_process([sys.executable, "-m", "runner.agl_host", self.spec], variables,
                                             user=self.user)
        return AgentResult(error=None if code == 0 else failure(code, err))


def make_agent(kind: str, target: str, check_env: dict[str, str], pass_env: tuple[str, ...] = (),
               user: AgentUser | None = None) -> CommandAgent | ClassAgent:
    """`check_env`: the variables an agent class is checked with (the proxy's URLs for no rollout yet);
    `pass_env`: the runner's variables a program agent also gets (`--pass-env`); `user`: whom its programs run as
    (`--agent-user`). An `--agent` function is runner/function_agent.py's."""
    if kind == "agent-class":
        return ClassAgent(target, check_env, pass_env, user)
    return CommandAgent(target, pass_env, user)


def as_agent(agent: Any) -> Any:
    """An agent object (anything with `async run(task, config, env) -> AgentResult`: the ones above, a
    HarnessAgent) as it is; any other callable as a FunctionAgent."""
    if not inspect.isroutine(agent) and callable(getattr(agent, "run", None)):
        return agent
    if not callable(agent):
        raise TypeError(f"an agent is a function (task, client_config) -> reward or an agent object, "
                        f"not {type(agent).__name__}")
    return FunctionAgent(agent)

"""The environment of every program `rlproxy run` starts for an agent (a `--command`, an agent class, a harness
and its `--verify`): an allow-list, never the runner's own environment minus a few names. The runner's
environment holds its own key (`RLPROXY_API_KEY`), database URLs and whatever secrets the machine has; an agent
runs code a model chose, so it gets only what a program needs to start, what the user names with `--pass-env`,
and the rollout's own variables (runner/agents.py, runner/harnesses/)."""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from runner.errors import RunInputError

# What any program needs to start and to behave as in the user's shell; none of them holds a secret.
BASICS = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM"})
BASIC_PREFIXES = ("LC_",)  # the locale's categories
# Every variable the runner sets itself for some kind of agent: the rollout's, Agent Lightning's, the harnesses'.
# A task's value never replaces one of them, and passing the runner's own copy has no point.
OWN = frozenset({
    "OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "RLPROXY_REWARD_URL",
    "RLPROXY_EVENT_URL", "RLPROXY_ROLLOUT_ID", "RLPROXY_TASK_ID", "RLPROXY_MODEL", "RLPROXY_EVAL", "RLPROXY_TASK",
    "RLPROXY_TASK_FILE", "AGL_OPENAI_BASE_URL", "AGL_EVENT_URL", "AGL_KEY", "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CONFIG_DIR", "CODEX_HOME", "XDG_CONFIG_HOME", "NO_COLOR"})
# Variables whose value makes a program load or run code: a task's data must never become one of them. Whole
# families where one member does (PYTHONWARNINGS imports the module its category names, GIT_EXTERNAL_DIFF and
# GIT_PAGER run commands, npm_config_script_shell chooses npm's shell, SHELLOPTS turns on bash's options).
LOADING = frozenset({"ENV", "SHELLOPTS", "BASHOPTS", "PERL5OPT", "PERL5LIB", "PERLLIB", "PERL5DB", "RUBYOPT",
                     "RUBYLIB", "PROMPT_COMMAND", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS",
                     "GCONV_PATH", "EDITOR", "VISUAL", "PAGER", "MANPAGER", "BROWSER", "LESSOPEN", "LESSCLOSE",
                     "SSH_ASKPASS", "SUDO_ASKPASS", "RUSTC_WRAPPER"})
LOADING_PREFIXES = ("LD_", "DYLD_", "GIT_", "PYTHON", "NODE_", "NPM_CONFIG_", "BASH_")
# Where programs send their requests, and whom they trust: a task's value would send the agent's calls, its key
# with them, to a host of the task's choosing.
NETWORK = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "FTP_PROXY", "SSL_CERT_FILE",
                     "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"})
# The runner's and the model clients' own namespaces: besides the variables the runner sets, clients read others
# there (OPENAI_API_BASE, ANTHROPIC_AUTH_TOKEN, ANTHROPIC_CUSTOM_HEADERS, CLAUDE_CODE_USE_BEDROCK) that would
# point the agent away from its rollout.
RESERVED_PREFIXES = ("RLPROXY_", "OPENAI_", "ANTHROPIC_", "AGL_", "CLAUDE_", "CODEX_")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_names(pass_env: Iterable[str], env_map: Mapping[str, str]) -> None:
    """`--pass-env NAME`s and `--env-map VAR=field` variables, checked before anything starts."""
    for name in pass_env:
        if not NAME.fullmatch(name):
            raise RunInputError(f"--pass-env {name!r}: not a variable name")
        if name in OWN:
            raise RunInputError(f"--pass-env {name}: the runner sets it itself for the agent (docs/run.md)")
    for variable, field in env_map.items():
        where = f"--env-map {variable}={field}"
        if not NAME.fullmatch(variable):
            raise RunInputError(f"{where}: {variable!r} is not a variable name")
        if variable in OWN or variable in BASICS or variable.startswith(BASIC_PREFIXES):
            raise RunInputError(f"{where}: the runner sets {variable} itself; name another variable")
        upper = variable.upper()  # proxies are read in either case (https_proxy), and so are npm's settings
        if upper.startswith(RESERVED_PREFIXES):
            raise RunInputError(f"{where}: {variable} is in the namespace the runner and the model clients read "
                                "(RLPROXY_, OPENAI_, ANTHROPIC_, AGL_, CLAUDE_, CODEX_); name another variable")
        if upper in LOADING or upper.startswith(LOADING_PREFIXES):
            raise RunInputError(f"{where}: {variable} makes programs load or run code; a task's data may not "
                                "set it")
        if upper in NETWORK:
            raise RunInputError(f"{where}: {variable} decides where programs send their requests (and the agent's "
                                "key with them); a task's data may not set it")


def inherited(pass_env: Iterable[str] = (), also: Iterable[str] = ()) -> dict[str, str]:
    """The variables of the runner's environment an agent gets: the basics, the `--pass-env` names (`also`: the
    runner's own needs for one kind of agent). Names that are not set are left out."""
    named = set(pass_env) | set(also)
    return {name: value for name, value in os.environ.items()
            if name in BASICS or name.startswith(BASIC_PREFIXES) or name in named}


PR_SET_DUMPABLE, PR_GET_DUMPABLE = 4, 3


def hide_own_environment() -> bool:
    """Make the runner's own process unreadable to the programs it starts, which run as the same user: without it
    an agent reads the runner's whole environment (its key, database URLs) from `/proc/<runner>/environ`, and the
    allow-list above is moot. Linux's "not dumpable" flag closes `/proc/<pid>/environ`, `mem` and ptrace to other
    processes of the user (not to root, which an agent should never be). False where there is no such flag."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0 and libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False

"""What an agent's programs may reach of the machine, where the kernel has Landlock (runner/confine_landlock.py).

An agent run as the runner's own user could read whatever that user can: the run's journal (`--log`), its task
files (`--tasks`, `--eval-tasks`: evaluation answers), the runner's key files and every other attempt's task.
Each program an attempt starts (a `--command`, an agent class, a harness and its `--verify`) is confined between
fork and exec, by an allow-list the runner builds:

- read and run: the system's folders (/usr, /bin, /lib*, /etc, /opt, /run, /sys), /proc's system-wide files and
  the program's own /proc/<pid> (no other process's: see _grant_proc), Python's prefixes and
  import path, the PATH's folders (and the prefix above a `bin` or `shims` one: npm's global packages, pyenv),
  the harness's own package, the runner's working folder and `--agent-read`;
- read and write: the attempt's own folders (its task folder with a fresh HOME and TMPDIR, a harness's working
  folder and home), /dev/shm, `--agent-write`; the usual devices (/dev/null, /dev/tty, /dev/pts...);
- never, even inside an allowed folder: the journal, the task files, the key files, every other attempt's
  folder, the hidden entries of the runner's HOME (~/.ssh, ~/.aws, ~/.config: when the run starts from HOME) but
  those a granted folder is in, and `.env` files of the runner's working folder. An allowed folder that holds
  one is not granted itself: its other entries are, one by one, down the path to what is kept out ("holes"),
  and the folders on that path may be listed (names, not contents). Links
  lead nowhere new: a path is checked where it ends, and a hard link to a file the agent cannot reach is
  refused (EXDEV).

Landlock also keeps the agent from ptrace of any process outside its own domain (the runner, the other attempts),
root or not; with ABI 6 its signals and abstract unix sockets too.
It does not confine the network, nor named unix sockets (docs/security.md).

Where there is no Landlock (older kernels, another system) agents run as before, unconfined: the run says so
once on its output and in the journal (each attempt's "started" line: confined false and why), and
`--require-confinement` refuses to start instead. A function handed to `runner.Runner` runs inside its caller
and is never confined; `--agent module:function` runs in a process of its own (runner/function_agent.py)."""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from runner import confine_landlock as landlock
from runner.errors import RunInputError

log = logging.getLogger("rlproxy.run")

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/run", "/snap", "/nix")
KERNEL = ("/sys",)  # the kernel's view, readable; /proc is granted apart (_grant_proc)
PROC = "/proc"
SECRETS = ("/run/secrets", "/var/run/secrets")  # containers' mounted secrets (Docker, Kubernetes service tokens)
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx")
DEVICE_FOLDERS = ("/dev/pts",)
SHARED = ("/dev/shm",)
ATTEMPT_PREFIX = "rlproxy-"  # the folders the runner makes for attempts in the temp folder (rlproxy-task-, -run-)

_policy: Policy | None = None
_also_protected: set[str] = set()


@dataclass(frozen=True)
class Policy:
    version: int  # the kernel's Landlock ABI
    protected: tuple[str, ...]  # real paths never reached: journal, task files, key files
    read: tuple[str, ...]  # --agent-read
    write: tuple[str, ...]  # --agent-write


def protect(paths: Iterable[Path | str | None]) -> None:
    """Files agents must never read besides the run's own (the key files a command read its secrets from)."""
    _also_protected.update(os.path.realpath(path) for path in paths if path is not None)


def start(protected: Iterable[Path | str | None], read: Iterable[Path] = (), write: Iterable[Path] = (),
          required: bool = False, why_not: str | None = None) -> tuple[bool, str | None]:
    """The run's confinement from here on: (True, None), or (False, why) where agents run unconfined; `why_not`:
    the caller's own reason (an `--agent` function). `required` (--require-confinement) raises instead."""
    global _policy
    version, why = landlock.abi()
    why = why_not or why
    if why is not None:
        _policy = None
        if required:
            raise RunInputError(f"--require-confinement: agents cannot be confined here: {why}")
        # the kernel's lack, said once; not the caller's own choice (--no-confine-agents, a function it runs
        # in its own process, as the demo does): that is on each attempt's journal line alone
        if why_not is None:
            log.warning("agents run unconfined: %s; they can read what this user can (the journal, the task files)",
                        why)
        return False, why
    paths = {os.path.realpath(path) for path in protected if path is not None} | _also_protected
    _policy = Policy(version, tuple(sorted(paths)), tuple(os.path.realpath(p) for p in read),
                     tuple(os.path.realpath(p) for p in write))
    return True, None


def stop() -> None:
    global _policy
    _policy = None


def active() -> Policy | None:
    return _policy


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def temp_root() -> str:
    return os.path.realpath(tempfile.gettempdir())


def attempt_folder(path: str) -> str | None:
    """The runner-made attempt folder (`<temp>/rlproxy-...`) `path` is in, else None."""
    temp = temp_root()
    if not _within(path, temp) or path == temp:
        return None
    top = path[len(temp.rstrip("/")) + 1:].split("/", 1)[0]
    return os.path.join(temp, top) if top.startswith(ATTEMPT_PREFIX) else None


def own_folders(env: dict[str, str], cwd: str | None) -> list[str]:
    """The folders the runner made for this attempt that its program was given: its working folder, HOME, TMPDIR
    and its task file's folder, where they are in an attempt folder of the temp folder (never the runner's own
    HOME or working folder)."""
    named = [cwd, env.get("HOME"), env.get("TMPDIR")]
    if env.get("RLPROXY_TASK_FILE"):
        named.append(os.path.dirname(env["RLPROXY_TASK_FILE"]))
    found: list[str] = []
    for path in named:
        if path and (real := os.path.realpath(path)) not in found and attempt_folder(real) is not None:
            found.append(real)
    return found


def ruleset_for(argv: list[str] | str, env: dict[str, str], cwd: str | None) -> tuple[int | None, dict[str, str]]:
    """The ruleset file descriptor a program is confined with (the caller closes it once the program started) and
    its environment (TMPDIR moved into its own folders); (None, env) when the run is not confined."""
    policy = _policy
    if policy is None:
        return None, env
    own = own_folders(env, cwd)
    if own and not any(_within(os.path.realpath(env.get("TMPDIR", "/tmp")), folder) for folder in own):
        # its HOME, else its attempt folder (a verifier's: never inside the working folder it checks)
        tops = [top for folder in own if (top := attempt_folder(folder)) in own]
        home = next((f for f in own if f == os.path.realpath(env.get("HOME", ""))), tops[0] if tops else own[0])
        tmp = os.path.join(home, ".tmp")
        os.makedirs(tmp, mode=0o700, exist_ok=True)
        env = {**env, "TMPDIR": tmp}
    mine = {attempt_folder(folder) for folder in own}
    temp = temp_root()
    try:  # every other attempt's folder existing now; those made later are in no folder the agent was given
        others = [os.path.join(temp, entry.name) for entry in os.scandir(temp)
                  if entry.name.startswith(ATTEMPT_PREFIX) and os.path.join(temp, entry.name) not in mine]
    except OSError:
        others = []
    readable = _readable(argv, env)
    holes = [*policy.protected, *(os.path.realpath(path) for path in SECRETS), *others, *_private(readable)]
    ruleset = landlock.Ruleset(policy.version)
    try:
        for root in readable:
            _grant(ruleset, root, landlock.READ, holes, temp)
        _grant_proc(ruleset)
        for root in SHARED + policy.write:
            _grant(ruleset, os.path.realpath(root), landlock.WRITE, holes, temp)
        for device in DEVICES:
            ruleset.allow(device, landlock.DEVICE)
        for folder in DEVICE_FOLDERS:
            ruleset.allow(folder, landlock.DEVICE | landlock.READ_DIR)
        for folder in own:  # the attempt's own: everything, its task file included
            ruleset.allow(folder, landlock.WRITE)
    except BaseException:
        ruleset.close()
        raise
    return ruleset.fd, env


def _readable(argv: list[str] | str, env: dict[str, str]) -> list[str]:
    """The folders a program needs to read and run: the system's, Python's, the PATH's, the program's package,
    the runner's working folder, --agent-read."""
    policy = _policy
    roots = [*SYSTEM, *KERNEL, sys.prefix, sys.base_prefix, sys.exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), os.getcwd(),
             *(entry for entry in sys.path if entry), *env.get("PYTHONPATH", "").split(os.pathsep),
             *env.get("PATH", "").split(os.pathsep), *(policy.read if policy else ())]
    home = os.path.realpath(os.path.expanduser("~"))
    for entry in env.get("PATH", "").split(os.pathsep):  # a prefix's bin: its lib too (npm -g, pyenv's shims)
        parent = os.path.dirname(os.path.realpath(entry)) if entry else ""
        if os.path.basename(entry.rstrip("/")) in ("bin", "shims") and parent not in ("/", home):
            roots.append(parent)
    if isinstance(argv, list) and argv and os.path.isabs(argv[0]):
        roots.append(_package_of(os.path.realpath(argv[0])))
    found: list[str] = []
    for root in roots:
        if root and os.path.isabs(root) and (real := os.path.realpath(root)) not in found and os.path.exists(real):
            found.append(real)
    return found


def _private(roots: list[str]) -> list[str]:
    """The runner's user's own secrets where a granted folder holds them (the run started from its HOME, say):
    the hidden entries of its HOME (~/.ssh, ~/.aws, ~/.config, shell history), but those a granted folder lies in
    (a ~/.venv, the ~/.pyenv its PATH names), and the `.env` files of the runner's working folder."""
    found: list[str] = []
    home = os.path.realpath(os.path.expanduser("~"))
    cwd = os.path.realpath(os.getcwd())
    with contextlib.suppress(OSError):
        if home != "/" and any(_within(home, root) for root in roots):
            for entry in os.scandir(home):
                path = os.path.join(home, entry.name)
                if entry.name.startswith(".") and not any(_within(root, path) for root in roots):
                    found.append(path)
    with contextlib.suppress(OSError):
        found += [os.path.join(cwd, entry.name) for entry in os.scandir(cwd)
                  if entry.name == ".env" or entry.name.startswith(".env.")]
    return found


def _grant_proc(ruleset: landlock.Ruleset) -> None:
    """/proc's system-wide files (cpuinfo, meminfo, stat, sys/...) and the listing of its processes, never a
    process's own folder: Landlock keeps `mem` and `fd` of other domains from the agent, not `environ`, which holds
    a concurrent attempt's task (RLPROXY_TASK, the --env-map values) and token. The program's own
    /proc/<pid> is granted in the child before it restricts itself (runner/confine_landlock.py); the processes
    it starts do not get theirs (`ps` lists no process)."""
    try:
        entries = list(os.scandir(PROC))
    except OSError:
        return
    ruleset.allow(PROC, landlock.READ_DIR)
    for entry in entries:
        if not entry.name.isdigit() and not entry.is_symlink():  # self, mounts, net: links into a process's own
            ruleset.allow(os.path.join(PROC, entry.name), landlock.READ_FILE | landlock.READ_DIR, follow=False)


def _package_of(program: str) -> str:
    """A node program's package folder (codex.js runs the binary its package holds), else its own folder."""
    path = Path(program).parent
    for folder in (path, *path.parents):
        if folder.parent.name == "node_modules" or (folder.parent.name.startswith("@")
                                                     and folder.parent.parent.name == "node_modules"):
            return str(folder)
    return str(path)


def _grant(ruleset: landlock.Ruleset, root: str, rights: int, holes: list[str], temp: str) -> None:
    """`rights` beneath `root`, but for the holes: a root in a hole is not granted; one holding a hole is granted
    entry by entry down the path to it. The temp folder as a whole is a hole too (every attempt's folder is made
    there), a folder below it is not."""
    if root == temp or any(_within(root, hole) for hole in holes):
        return
    inside = [hole for hole in [*holes, temp] if _within(hole, root) and hole != root]
    if not inside:
        ruleset.allow(root, rights)
        return
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    # listed (Python finds modules by listing a folder; `ls` works), its entries' names beneath shown, not read
    ruleset.allow(root, rights & landlock.READ_DIR)
    for entry in entries:
        path = os.path.join(root, entry.name)
        if entry.is_symlink():  # a link is followed where it ends: the target has its own place
            continue
        if any(_within(hole, path) for hole in inside):
            if entry.is_dir(follow_symlinks=False) and not any(hole == path for hole in inside):
                _grant(ruleset, path, rights, holes, temp)
            continue
        ruleset.allow(path, rights, follow=False)


def fresh_home(folder: Path) -> dict[str, str]:
    """A confined attempt's HOME and TMPDIR, made in its own folder (the runner's HOME is not its to read or
    write); nothing where the run is not confined."""
    if _policy is None:
        return {}
    home, tmp = folder / "home", folder / "tmp"
    home.mkdir(mode=0o700, exist_ok=True)
    tmp.mkdir(mode=0o700, exist_ok=True)
    return {"HOME": str(home), "TMPDIR": str(tmp)}


def forget_own_environment() -> bool:
    """Blank the block the kernel shows as `/proc/<runner>/environ`: the variables this process started with
    (its key among them). Not dumpable (runner/environment.py) keeps other processes of its user out, not root's,
    and Landlock keeps a confined agent from the runner's memory (`mem`) but not from `environ`: an agent run as
    root read the runner's key there. Every variable is set again first (libc's `environ` then points at copies,
    so getenv and os.environ see what they saw), then the startup block is zeroed. False where it cannot be."""
    try:
        with open("/proc/self/stat", encoding="ascii") as file:
            stat = file.read()
        fields = stat[stat.rindex(")") + 2:].split()  # from field 3 (state) on: env_start, env_end are 50, 51
        start, end = int(fields[47]), int(fields[48])
        for name, value in os.environ.items():
            os.putenv(name, value)
        if end > start:
            ctypes.memset(start, 0, end - start)
        return True
    except (OSError, ValueError, IndexError, AttributeError):
        return False

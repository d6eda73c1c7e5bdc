"""`--agent-user`: the agents' programs run as another user than the runner, so that what the runner keeps to itself
is out of their reach by the system's own permissions: its journal (`--log`, 0600), its task files (every task,
evaluation answers included) and the other attempts' task files, which the runner writes into folders of their own.

An agent run as the runner's own user can read whatever that user can (file modes stop other users, not the
owner): `/proc/<runner>/environ` is closed (runner/environment.py), the files are not. Switching users needs root
(or CAP_SETUID and CAP_SETGID); before anything starts the runner checks, as the agent user, that it cannot read
the task files and the journal, and refuses the run naming the one it can (docs/run.md)."""
from __future__ import annotations

import os
import pwd
import subprocess
from dataclasses import dataclass
from pathlib import Path

from runner.errors import RunInputError


@dataclass(frozen=True)
class AgentUser:
    name: str
    uid: int
    gid: int
    home: str

    def variables(self) -> dict[str, str]:
        """The variables naming the user, as its own login would set them (the runner's would name root)."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}

    def become(self) -> None:
        """In a program about to start (`preexec_fn`): this user's groups, group and user, for good."""
        os.setgroups(os.getgrouplist(self.name, self.gid))
        os.setresgid(self.gid, self.gid, self.gid)
        os.setresuid(self.uid, self.uid, self.uid)

    def give(self, path: Path) -> None:
        """A folder of the attempt's (its task file, a harness's working folder and home) made the user's own."""
        os.chown(path, self.uid, self.gid, follow_symlinks=False)
        if path.is_dir() and not path.is_symlink():
            for root, folders, files in os.walk(path):
                for name in folders + files:
                    os.chown(os.path.join(root, name), self.uid, self.gid, follow_symlinks=False)


def agent_user(name: str | None) -> AgentUser | None:
    """The `--agent-user` (a name or a number), or RunInputError saying why it cannot be."""
    if name is None:
        return None
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError):
        raise RunInputError(f"--agent-user {name!r}: no such user") from None
    if entry.pw_uid == os.geteuid():
        raise RunInputError(f"--agent-user {name!r} is the runner's own user: name another")
    if os.geteuid() != 0:
        raise RunInputError(f"--agent-user {name!r}: switching users needs root (the runner runs as uid "
                            f"{os.geteuid()})")
    return AgentUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def refuse_readable(user: AgentUser, paths: dict[str, Path]) -> None:
    """RunInputError naming the first of `paths` (flag -> path) the user can read, asked as that user."""
    given = {flag: path for flag, path in paths.items() if path is not None and path.exists()}
    if not given:
        return
    listed = [str(path.resolve()) for path in given.values()]
    done = subprocess.run(["/bin/sh", "-c", 'for f; do [ -r "$f" ] && printf "%s\\n" "$f"; done; true', "sh",
                           *listed], capture_output=True, text=True, preexec_fn=user.become,
                          env={"PATH": "/usr/bin:/bin"}, cwd="/", stdin=subprocess.DEVNULL, timeout=30)
    readable = set(done.stdout.splitlines())
    for (flag, path), resolved in zip(given.items(), listed):
        if resolved in readable:
            what = "the runner's key" if flag.endswith("-key-file") else \
                "every task and evaluation answer (or the run's journal)"
            raise RunInputError(f"{flag} {path}: the agents' user {user.name} can read it, and with it {what}; "
                                "make it unreadable to that user (chmod 600, or a folder of mode 0700)")

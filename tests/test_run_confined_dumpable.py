"""`rlproxy run` makes itself not dumpable before any agent starts (runner/environment.py): another process of
the same user, as an agent run without --agent-user is, gets PermissionError on /proc/<runner>/environ. Two real
processes of one user (nobody when the tests run as root; the runner's blanking of its startup variables, which
also covers an agent run as root, is tests/test_run_confined.py's)."""
from __future__ import annotations

import os
import pwd
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/<pid>/environ is Linux's")
PYTHON = "/usr/bin/python3" if os.geteuid() == 0 else sys.executable  # one that user may run (root's is 0700)


def as_one_user() -> None:
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.setgroups([])
        os.setresgid(nobody.pw_gid, nobody.pw_gid, nobody.pw_gid)
        os.setresuid(nobody.pw_uid, nobody.pw_uid, nobody.pw_uid)


def test_a_process_of_the_same_user_cannot_read_the_runners_environment():
    holder = subprocess.Popen(
        [PYTHON, "-c", "import time; from runner.environment import hide_own_environment; "
                       "print(hide_own_environment(), flush=True); time.sleep(30)"],
        env={"PYTHONPATH": str(ROOT), "THE_RUNNERS_KEY": "rlp_secret"}, stdout=subprocess.PIPE, text=True,
        preexec_fn=as_one_user, cwd="/")
    try:
        assert holder.stdout.readline().strip() == "True"
        reader = subprocess.run([PYTHON, "-c", f"open('/proc/{holder.pid}/environ', 'rb').read()"],
                                capture_output=True, text=True, preexec_fn=as_one_user, cwd="/", timeout=30)
        assert reader.returncode == 1 and "PermissionError" in reader.stderr, reader.stderr
    finally:
        holder.kill()
        holder.wait()

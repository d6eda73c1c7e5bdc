"""Landlock (Linux 5.13 and later) by its three system calls through ctypes: a ruleset built in the runner, each
rule a folder or file and the rights granted beneath it, then handed to an agent's program, which restricts
itself with it between fork and exec (runner/confine.py says which folders; runner/agents.py starts the programs).

Hand-written rather than taken from PyPI's `landlock` (1.0.0.dev5, an alpha release of one author): it builds and
applies a ruleset in the process that restricts itself, where here the rules are built in the runner (listing
folders, opening a few dozen paths) and the child only makes two system calls before its program runs (no
allocation, no import between fork and exec); and it knows filesystem rights only, not ABI 6's scopes (signals
and abstract unix sockets to processes outside the agent's domain), which the confinement uses.

The system call numbers are those of the unified table every Linux architecture shares since 5.1 (x86_64 and
aarch64 alike: 444, 445, 446)."""
from __future__ import annotations

import ctypes
import errno
import functools
import os

CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3 and 5
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

READ = EXECUTE | READ_FILE | READ_DIR  # read and run what is beneath, list its folders
DEVICE = READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV  # /dev/null, /dev/tty and the like
WRITE = (1 << 16) - 1  # everything (masked to what the kernel knows)
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # all a rule on a file (not a folder) takes


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


@functools.cache
def abi() -> tuple[int, str | None]:
    """(the kernel's Landlock ABI version, None) or (0, why there is none)."""
    try:
        version = _libc().syscall(CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    except (OSError, AttributeError) as exc:  # no libc to call through (not Linux)
        return 0, f"no Landlock here ({exc})"
    if version > 0:
        return int(version), None
    code = ctypes.get_errno()
    if code == errno.ENOSYS:
        return 0, "the kernel has no Landlock (Linux 5.13 or later, built with CONFIG_SECURITY_LANDLOCK)"
    if code == errno.EOPNOTSUPP:
        return 0, "Landlock is built in but off (add landlock to the kernel's lsm= boot option)"
    return 0, f"Landlock is unavailable ({os.strerror(code)})"


def handled_fs(version: int) -> int:
    rights = (1 << 13) - 1
    if version >= 2:
        rights |= REFER
    if version >= 3:
        rights |= TRUNCATE
    if version >= 5:
        rights |= IOCTL_DEV
    return rights


class Ruleset:
    """Every filesystem right the kernel knows is handled (denied unless a rule grants it); with ABI 6, signals and
    abstract unix sockets are scoped to the agent's own domain."""

    def __init__(self, version: int) -> None:
        self.fs = handled_fs(version)
        self.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if version >= 6 else 0
        attr = RulesetAttr(self.fs, 0, self.scoped)
        size = 8 if version < 4 else 16 if version < 6 else 24  # the struct as this ABI knows it
        fd = _libc().syscall(CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"landlock_create_ruleset: {os.strerror(code)}")
        self.fd = int(fd)  # close-on-exec, as the kernel makes it

    def allow(self, path: str, rights: int, follow: bool = True) -> bool:
        """`rights` beneath `path` (a file takes file rights only); False when it is not there (or a link, with
        follow=False: a link is never a rule, its target is reached through its own place)."""
        flags = os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
        try:
            fd = os.open(path, flags)
        except OSError:
            return False
        try:
            kind = os.fstat(fd).st_mode
            if not follow and (kind & 0o170000) == 0o120000:
                return False
            if (kind & 0o170000) != 0o040000:
                rights &= FILE_RIGHTS
            attr = PathBeneathAttr(rights & self.fs, fd)
            if _libc().syscall(ADD_RULE, ctypes.c_int(self.fd), ctypes.c_int(RULE_PATH_BENEATH), ctypes.byref(attr),
                               ctypes.c_uint32(0)) < 0:
                code = ctypes.get_errno()
                raise OSError(code, f"landlock_add_rule {path}: {os.strerror(code)}")
            return True
        finally:
            os.close(fd)

    def close(self) -> None:
        os.close(self.fd)


def restrict_self(ruleset_fd: int) -> None:
    """In the child, between fork and exec: no new privileges (no setuid program regains what is taken), then the
    ruleset for good. A failure ends the child (exit status 126, as a shell's "cannot run") with the reason on its
    standard error: an agent never runs unconfined when it was to be confined."""
    libc = _libc()
    try:  # its own /proc/<pid> (the runner could not name it before the fork), readable
        own = os.open("/proc/self", os.O_PATH | os.O_CLOEXEC)
    except OSError:
        own = -1
    if own >= 0:
        attr = PathBeneathAttr(READ_FILE | READ_DIR, own)
        libc.syscall(ADD_RULE, ctypes.c_int(ruleset_fd), ctypes.c_int(RULE_PATH_BENEATH), ctypes.byref(attr),
                     ctypes.c_uint32(0))
        os.close(own)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.syscall(RESTRICT_SELF, ctypes.c_int(ruleset_fd), ctypes.c_uint32(0)) != 0:
        os.write(2, f"rlproxy run: cannot confine the agent: {os.strerror(ctypes.get_errno())}\n".encode())
        os._exit(126)

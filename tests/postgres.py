"""A throwaway PostgreSQL server for a test run, started from whatever server binaries this machine has.

    bin_dir = server_binaries()                      # the system's (Debian's, or on PATH), else the install's
    with temporary_server(bin_dir) as url:           # initdb into a new temp dir, a free port, trust auth
        psycopg.connect(url)                         # postgresql://postgres@127.0.0.1:<port>/postgres

scripts/install.sh installs the `pgserver` wheel (PostgreSQL's server binaries, built to run from any
folder) where the machine has none, so a fresh machine needs no Postgres of its own; its Python code is
not used, only the binaries it ships. PostgreSQL refuses to run as root: as root the server runs as
`nobody`, from a copy of the binaries if `nobody` cannot read them where they are.
"""
from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

from tests.support import free_port

# Durability is not what the tests measure: no fsync, and room for every proxy's connection pool.
SERVER_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
                   "max_connections": "200", "listen_addresses": "127.0.0.1"}
_SERVER_PROGRAMS = ("initdb", "postgres")


def server_binaries(*, system: bool = True) -> Path | None:
    """A folder holding `initdb` and `postgres`: the system's newest (with `system`), else the installed wheel's."""
    candidates = []
    if system:
        candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True)
        if which := shutil.which("initdb"):
            candidates.append(str(Path(which).resolve().parent))
    spec = importlib.util.find_spec("pgserver")  # found, never imported: only its binaries are used
    if spec is not None and spec.origin:
        candidates.append(str(Path(spec.origin).parent / "pginstall" / "bin"))
    for folder in map(Path, candidates):
        if all(os.access(folder / program, os.X_OK) for program in _SERVER_PROGRAMS):
            return folder
    return None


@contextlib.contextmanager
def temporary_server(bin_dir: Path, *, timeout: float = 60.0) -> Iterator[str]:
    """A new cluster in a new temp dir, served on a free loopback port until the block ends, then deleted."""
    base = Path(tempfile.mkdtemp(prefix="rlproxy-pg-"))
    run_as = _unprivileged_user() if os.geteuid() == 0 else None
    try:
        if run_as is not None:
            os.chown(base, run_as.pw_uid, run_as.pw_gid)
            if not _readable_by_all(bin_dir):
                bin_dir = _copy_install(bin_dir, base / "install")
        user = {"user": run_as.pw_uid, "group": run_as.pw_gid, "extra_groups": []} if run_as else {}
        data, sockets, log_path = base / "data", base / "sockets", base / "server.log"
        initdb = subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                                 "-E", "UTF8", "--locale=C", "--no-sync"], capture_output=True, text=True, **user)
        if initdb.returncode != 0:
            raise RuntimeError(f"initdb failed ({bin_dir}):\n{initdb.stdout}{initdb.stderr}")
        _make(sockets, run_as)
        port = free_port()
        options = [arg for name, value in SERVER_SETTINGS.items() for arg in ("-c", f"{name}={value}")]
        with open(log_path, "wb") as log:
            server = subprocess.Popen([str(bin_dir / "postgres"), "-D", str(data), "-p", str(port),
                                       "-k", str(sockets), *options], stdout=log, stderr=subprocess.STDOUT, **user)
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        try:
            _wait_ready(url, server, log_path, timeout)
            yield url
        finally:
            server.send_signal(signal.SIGINT)  # "fast" shutdown: roll back open transactions, then exit
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _wait_ready(url: str, server: subprocess.Popen, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(url, connect_timeout=2):
                return
        except psycopg.OperationalError:
            if server.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"PostgreSQL did not start ({url}); its log ends:\n{tail}") from None
            time.sleep(0.2)


def _version(folder: str) -> tuple[int, ...]:
    name = Path(folder).parent.name
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def _unprivileged_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        raise RuntimeError("PostgreSQL cannot run as root and this machine has no user 'nobody' to run it as") from None


def _readable_by_all(bin_dir: Path) -> bool:
    """Whether every folder above the binaries lets others through and the programs let others run them."""
    folders = [p for p in bin_dir.resolve().parents] + [bin_dir.resolve()]
    if not all(p.stat().st_mode & stat.S_IXOTH for p in folders):
        return False
    return all((bin_dir / program).stat().st_mode & stat.S_IXOTH for program in _SERVER_PROGRAMS)


def _copy_install(bin_dir: Path, target: Path) -> Path:
    """The install (bin/, lib/, share/ side by side: the programs find the rest relative to themselves) copied where
    `nobody` can read it. A wheel's programs load their shared libraries from `<package>.libs` beside the package
    (RPATH $ORIGIN/../../../pgserver.libs), so that folder comes along, at the same relative place."""
    root = bin_dir.resolve().parent
    package = root.parent
    copy = target / package.name / root.name
    shutil.copytree(root, copy, symlinks=True)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, target / libs.name, symlinks=True)
    for folder in [target, *(p for p in target.rglob("*") if p.is_dir())]:
        folder.chmod(folder.stat().st_mode | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    return copy / "bin"


def _make(folder: Path, owner: pwd.struct_passwd | None) -> None:
    folder.mkdir()
    if owner is not None:
        os.chown(folder, owner.pw_uid, owner.pw_gid)

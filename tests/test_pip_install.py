"""`pip install rlproxy` (the proxy alone, no extras) gives a working `rlproxy`: it serves, migrates and answers
`--help` with nothing beyond pyproject's `dependencies`; the demo, the trainer and the engine say which extra
to install instead of failing with a traceback.

The environment is a fresh virtual environment holding the wheel pip builds from a copy of this checkout (so no
build output lands in the repository) and, beside it, exactly the distributions its `Requires-Dist` names
(without extras), taken file by file from the test run's own environment: resolving them from the package
index again would cost minutes of network round trips on every run and prove nothing more.
"""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import requests
from packaging.requirements import Requirement

from tests.support import ROOT, free_port, running

SKIP = shutil.ignore_patterns(".git", ".venv", "node_modules", "__pycache__", "*.egg-info", "build", "dist",
                              ".pytest_cache", "*.db")


def _declared(wheel: Path) -> list[Requirement]:
    """The wheel's own dependencies (its Requires-Dist lines that no extra adds)."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    requirements = [Requirement(line.split(":", 1)[1]) for line in lines if line.startswith("Requires-Dist:")]
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]


def _closure(requirements: list[Requirement]) -> list[importlib.metadata.Distribution]:
    """The installed distributions these requirements need, with theirs, recursively."""
    found: dict[str, importlib.metadata.Distribution] = {}
    seen: set[tuple[str, str]] = set()  # (distribution, extra): sqlalchemy and sqlalchemy[asyncio] differ
    pending = list(requirements)
    while pending:
        requirement = pending.pop()
        name = requirement.name.lower().replace("_", "-")
        extras = [extra for extra in ["", *requirement.extras] if (name, extra) not in seen]
        if not extras:
            continue
        seen.update((name, extra) for extra in extras)
        found[name] = dist = importlib.metadata.distribution(requirement.name)
        for line in dist.requires or ():
            needed = Requirement(line)
            if needed.marker is None or any(needed.marker.evaluate({"extra": e}) for e in extras):
                pending.append(needed)
    return list(found.values())


@pytest.fixture(scope="session")
def proxy_alone(tmp_path_factory) -> Path:
    """A virtual environment with rlproxy and only its declared dependencies; its `bin` folder."""
    work = tmp_path_factory.mktemp("pip-install")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=SKIP)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", work / "wheel", source],
                   check=True)
    [wheel] = (work / "wheel").glob("rlproxy-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    subprocess.run([*pip, "--python", venv / "bin" / "python", "install", "--no-deps", "--no-index", wheel],
                   check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    for dist in _closure(_declared(wheel)):
        for file in dist.files or ():
            target = site / file
            if ".." in file.parts or target.exists():  # console scripts (../../bin) are not needed
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(dist.locate_file(file))
    return venv / "bin"


def rlproxy(bin_dir: Path, *commands: list[str], cwd: Path) -> list[subprocess.CompletedProcess]:
    """Each command line's outcome; they run side by side."""
    started = [(args, subprocess.Popen([bin_dir / "rlproxy", *args], cwd=cwd, env=_alone_env(), text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)) for args in commands]
    outputs = [(args, process.communicate(timeout=120), process.returncode) for args, process in started]
    return [subprocess.CompletedProcess(args, code, out, err) for args, (out, err), code in outputs]


def _alone_env() -> dict[str, str]:
    """This environment without the test run's import path (it may name the checkout; empty is none)."""
    return {**os.environ, "PYTHONPATH": ""}


def test_the_proxy_alone_cannot_import_what_the_extras_bring(proxy_alone, tmp_path):
    probe = subprocess.run([proxy_alone / "python", "-c", "import importlib.util as u; print([m for m in ("
                            "'openai', 'torch', 'vllm', 'transformers') if u.find_spec(m)])"],
                           cwd=tmp_path, env=_alone_env(), capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "[]"


def test_help_and_migrate_work_with_the_proxy_alone(proxy_alone, tmp_path):
    helped, serve_helped, migrated = rlproxy(
        proxy_alone, ["--help"], ["serve", "--help"],
        ["migrate", "--database-url", f"sqlite+aiosqlite:///{tmp_path / 'a.db'}"], cwd=tmp_path)

    for run in (helped, serve_helped):
        assert run.returncode == 0 and "Usage: rlproxy" in run.stdout, run.stderr
    assert "serve" in helped.stdout and "--upstream" in serve_helped.stdout
    assert migrated.returncode == 0 and "newest schema" in migrated.stdout, migrated.stderr


def test_commands_that_need_an_extra_name_it_in_one_line(proxy_alone, tmp_path):
    runs = rlproxy(proxy_alone, ["demo"], ["train", "--upstream", "http://127.0.0.1:9"], ["engine"],
                   ["serve"], cwd=tmp_path)  # serve without --upstream starts a local engine

    for run, extra in zip(runs, ["demo", "train", "engine", "engine"]):
        assert run.returncode == 2, (run.args, run.stderr)
        assert f"pip install 'rlproxy[{extra}]'" in run.stderr and "Traceback" not in run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_serve_records_a_chat_call_with_the_proxy_alone(proxy_alone, stub_url, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = [proxy_alone / "rlproxy", "serve", "--port", str(port), "--upstream", stub_url,
             "--database-url", f"sqlite+aiosqlite:///{tmp_path / 'proxy.db'}"]
    with running(serve, url + "/healthz", env=_alone_env(), log_path=tmp_path / "proxy.log", cwd=tmp_path):
        rollout = requests.post(f"{url}/rollouts", json={}).json()
        answer = requests.post(f"{rollout['base_url']}/chat/completions", json={
            "model": "stub-model", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
        [call] = requests.get(f"{url}/rollouts/{rollout['rollout_id']}").json()["calls"]
    assert call["status"] == "ok" and call["completion_token_ids"]

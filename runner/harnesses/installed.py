"""Where a harness's program is and whether it is the pinned version: checked before any attempt starts, so
that a missing harness or one at another version (whose flags, configuration files or wire format may
differ from what its module writes) stops the run with the command that installs the tested one.

The version is read from the package the program belongs to (npm's `package.json` above its script, or the
`*.dist-info` folder of the virtualenv it sits in), never by running it: nothing of a harness runs before its
attempt, and reading a file costs nothing where `aider --version` imports for seconds."""
from __future__ import annotations

import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from runner.errors import RunInputError

NODE, PYTHON = "npm", "pip"


@dataclass(frozen=True)
class Pin:
    """A harness's program, the package that brings it and the version it is tested at."""

    program: str  # the executable's name
    package: str  # npm package or PyPI distribution
    version: str
    ecosystem: str  # NODE or PYTHON
    venv: str = ""  # PYTHON: its own virtualenv under .venv/harnesses/ (its pins clash with the engine's)

    def folders(self, prefix: Path) -> list[Path]:
        """Where scripts/install.sh puts it, searched before PATH."""
        if self.ecosystem == NODE:
            return [prefix / "node" / "node_modules" / ".bin"]
        return [prefix / "harnesses" / self.venv / "bin"]

    def install_command(self, prefix: Path) -> str:
        if self.ecosystem == NODE:
            return f"make install, or: npm install --prefix {prefix / 'node'} {self.package}@{self.version}"
        venv = prefix / "harnesses" / self.venv
        pip = f"{venv}/bin/pip install {self.package}=={self.version}"
        return f"make install, or: python -m venv {venv} && {pip}"


def installed_version(executable: Path, pin: Pin) -> str | None:
    """The version of `pin.package` that `executable` comes from; None when it is not from that package."""
    if pin.ecosystem == NODE:
        for folder in executable.resolve().parents:
            manifest = folder / "package.json"
            if manifest.is_file():
                try:
                    data = json.loads(manifest.read_text())
                except (OSError, ValueError):
                    return None
                if data.get("name") == pin.package:
                    return str(data.get("version"))
        return None
    wanted = re.sub(r"[-_.]+", "_", pin.package).lower()
    for info in executable.absolute().parent.parent.glob("lib/python*/site-packages/*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        if re.sub(r"[-_.]+", "_", name).lower() == wanted:
            return version
    return None


def find_program(name: str, pin: Pin, prefix: Path | None = None) -> str:
    """The harness's executable at its pinned version: in this environment's own folders (scripts/install.sh),
    else on PATH. Refused (RunInputError) when missing or at another version, naming the install command."""
    prefix = Path(sys.prefix) if prefix is None else prefix
    found = next((str(folder / pin.program) for folder in pin.folders(prefix)
                  if (folder / pin.program).is_file()), None) or shutil.which(pin.program)
    install = pin.install_command(prefix)
    if found is None:
        raise RunInputError(f"--harness {name}: `{pin.program}` is not installed ({install})")
    version = installed_version(Path(found), pin)
    if version != pin.version:
        at = f"at {version}" if version else f"not from {pin.package}"
        raise RunInputError(f"--harness {name}: {found} is {at}; rlproxy run is tested with {pin.package} "
                            f"{pin.version} ({install})")
    return found

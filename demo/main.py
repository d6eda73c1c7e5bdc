"""`rlproxy demo` from the command line: the terminal kept for rlproxy's own view (demo/output.py), the run
with its steps and panel (demo/report.py), then the summary and reward curve, or one line saying why it
failed and which log has the rest."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

from core.settings import DemoSettings
from demo.output import own_terminal
from demo.report import Report
from demo.run import Demo
from demo.startup import StartupError, check_ports, explain
from demo.view import reward_curve, summary

log = logging.getLogger("rlproxy.demo")


def run_demo(settings: DemoSettings, curve_dir: Path) -> int:
    """Runs the demo; returns the exit status (0, or 1 after saying why it failed)."""
    verbose = logging.getLogger().isEnabledFor(logging.DEBUG)  # `rlproxy -v demo`: debug lines in rlproxy.log
    with own_terminal(settings.workdir, engine=settings.upstream is None, headless=settings.headless,
                      verbose=verbose) as terminal:
        if terminal.live:
            terminal.console.print(terminal.describe_logs(), style="dim", soft_wrap=True)
        else:  # with the progress lines, not in the summary
            terminal.err.write(terminal.describe_logs() + "\n")
        try:  # before anything starts (Demo checks again later)
            check_ports(settings.proxy_port, None if settings.upstream else settings.engine_port)
        except StartupError as exc:
            terminal.err.write(f"{exc}\n")
            return 1
        try:
            progress = asyncio.run(Demo(settings, Report(terminal)).run())
        except Exception as exc:  # the traceback goes to rlproxy.log, the reason to the user
            log.exception("rlproxy demo failed")
            terminal.err.write(explain(exc, terminal.rlproxy_log, terminal.engine_log) + "\n")
            return 1
        if progress.run_started is None:  # Ctrl-C during start-up
            terminal.err.write("stopped during start-up: nothing ran yet\n")
            return 0
        summary(progress, settings, terminal.console)
        curve = reward_curve(progress, curve_dir / "rlproxy-reward-curve.png")
        if curve:
            terminal.console.print(f"reward curve: {curve}", soft_wrap=True)
        # The demo's proxy stops with it; its database keeps every episode for the web view (docs/ui.md).
        serve = serve_command(settings.database_url, settings.proxy_port)
        view = f"http://127.0.0.1:{settings.proxy_port}/ui/"
        terminal.console.print(f"each episode in the web view: {serve}, then {view}", soft_wrap=True)
    return 0


def serve_command(database_url: str, port: int) -> str:
    """The command that serves the demo's database: its URL on the command line only when it holds no password
    (a terminal's scrollback and shell history keep what is printed; `rlproxy serve` refuses a password given
    there), else the database named without it and the password left to RLPROXY_DATABASE_URL."""
    parts = urlsplit(database_url)
    try:
        secret = parts.password is not None or "password" in {name.lower() for name in parse_qs(parts.query)}
    except ValueError:
        secret = True
    if not secret:
        return f"rlproxy serve --database-url {database_url} --port {port}"
    host = parts.hostname or ""
    where = urlunsplit((parts.scheme, f"{parts.username or ''}@{host}" + (f":{parts.port}" if parts.port else ""),
                        parts.path, "", ""))
    return (f"RLPROXY_DATABASE_URL set to the demo's database ({where}, with its password), rlproxy serve --port "
            f"{port}")


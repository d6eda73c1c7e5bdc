"""The order in which a request is checked is written in one place, proxy/checks.py, and docs/architecture.md
shows the same order: the application runs exactly that middleware list, and CompletionServing.handle runs the
body checks in the order `BODY_CHECKS` names them. When one of these fails, the code's order changed: change
proxy/checks.py and docs/architecture.md with it."""
from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

from core.settings import ProxySettings
from proxy import checks
from proxy.app import build_app
from proxy.serving import CompletionServing

ROOT = Path(__file__).resolve().parents[2]
MIDDLEWARE = ["close_refused", "body_deadline", "api_errors", "valid_host", "authenticate", "enforce_limits",
              "scope_rollouts"]


def name_of(middleware) -> str:
    """A middleware's name; body_deadline(seconds) is a closure named after its maker."""
    return middleware.__qualname__.split(".")[0]


def test_the_application_runs_the_middleware_in_the_order_checks_names():
    app = build_app(ProxySettings())
    assert [name_of(m) for m in app.middlewares] == [name_of(m) for m in checks.middlewares(ProxySettings())]
    assert [name_of(m) for m in app.middlewares] == MIDDLEWARE


def test_the_opening_of_checks_lists_the_middleware_in_that_order():
    listed = re.findall(r"^    (\w+)\s{2,}", checks.__doc__, re.MULTILINE)
    assert listed == MIDDLEWARE


def test_serving_runs_the_body_checks_in_the_order_checks_names():
    handle = ast.parse(textwrap.dedent(inspect.getsource(CompletionServing.handle)))
    called = [ast.unparse(node.func) for node in ast.walk(handle) if isinstance(node, ast.Call)]
    order = sorted((node.lineno, node.col_offset, ast.unparse(node.func)) for node in ast.walk(handle)
                   if isinstance(node, ast.Call))
    calls = [name for _, _, name in order]
    positions = []
    for call, _ in checks.BODY_CHECKS:
        assert call in called, f"CompletionServing.handle no longer calls {call}"
        positions.append(calls.index(call))
    assert positions == sorted(positions), [calls[p] for p in sorted(positions)]


def test_the_architecture_page_draws_the_same_order():
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page[page.index("## In what order a request is checked"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    shown = [name for name in re.findall(r"`([\w.]+)`", section)]
    middleware = [name for name in shown if name in MIDDLEWARE]
    assert middleware == MIDDLEWARE
    body = [name for name in shown if name in {call for call, _ in checks.BODY_CHECKS}]
    assert body == [call for call, _ in checks.BODY_CHECKS]

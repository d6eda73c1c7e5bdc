"""The house as docs/architecture.md draws it, checked against the code's own imports: which package may import
which (arrows run one way: agent -> proxy -> store -> trainer -> engine), no import circles between modules,
and no import hidden inside a function except of an optional heavy dependency.

When this fails, either the change imports against the flow (move the shared piece down a floor) or the plan
changed (change docs/architecture.md and LAYERS together)."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# package -> the project packages it may import (besides itself). Bottom floor first; docs/architecture.md.
LAYERS: dict[str, set[str]] = {
    "core": set(),
    "rewards": {"core"},
    "runner": {"core"},
    "store": {"core", "rewards"},
    "migrations": {"core", "store"},
    "engine": {"core", "store"},
    "proxy": {"core", "rewards", "store", "migrations", "engine"},
    "trainer": {"core", "rewards", "store", "engine"},
    "demo": {"core", "rewards", "store", "migrations", "engine", "proxy", "trainer", "runner"},
    "rlproxy": {"core", "rewards", "store", "migrations", "engine", "proxy", "trainer", "demo", "runner"},
    # Not shipped: what the tests and benchmarks use to run the product for real.
    "testkit": {"core", "rewards", "store", "migrations", "engine", "proxy", "trainer"},
}
SHIPPED = [name for name in LAYERS if name != "testkit"]
PROJECT = set(LAYERS) | {"tests", "bench"}

# Imported inside functions on purpose: optional or heavy, so that the proxy (which has no torch) and quick
# commands start without them. Anything else is imported at the top of its module.
HEAVY = {"torch", "transformers", "peft", "safetensors", "openrlhf", "matplotlib", "datasets", "uvloop", "vllm",
         "gguf", "ctypes"}
# The command line imports in a function only the parts that need an optional extra (the trainer and the demo:
# torch, vLLM, openai), each command what it runs: the proxy's image has none of them, and `rlproxy serve`
# must not load the trainer. It says why where it does.
LAZY_PACKAGES = {"rlproxy"}
OPTIONAL_PARTS = {"trainer", "demo"}


def modules() -> dict[str, Path]:
    found = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(path: Path, module: str) -> list[tuple[str, bool, int]]:
    """(imported module, inside a function?, line) for every import of `path`, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend((alias.name, nested, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the module's own package, one level up per dot after the first
                    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                    package = package[: len(package) - child.level + 1]
                    base = ".".join(package + ([base] if base else []))
                found.append((base, nested, child.lineno))
                found.extend((f"{base}.{alias.name}", nested, child.lineno) for alias in child.names)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                continue  # annotations only
            else:
                visit(child, inner)

    visit(tree, False)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def test_every_package_imports_only_the_floors_below_it():
    wrong = []
    for module, path in modules().items():
        package = module.split(".")[0]
        for name, _, line in imports(path, module):
            target = name.split(".")[0]
            if target in PROJECT and target != package and target not in LAYERS[package]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name} ({package} may import "
                             f"{sorted(LAYERS[package]) or 'nothing of the project'})")
    assert not wrong, "\n".join(wrong)


def test_nothing_imports_the_command_line_or_the_test_helpers():
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {name}"
             for module, path in modules().items() for name, _, line in imports(path, module)
             if name.split(".")[0] in ({"rlproxy"} - {module.split(".")[0]}) | {"tests", "bench"}
             or (name.split(".")[0] == "testkit" and module.split(".")[0] in SHIPPED)]
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_another_in_a_circle():
    graph: dict[str, set[str]] = {}
    known = modules()
    for module, path in known.items():
        graph[module] = {name if name in known else name.rsplit(".", 1)[0]
                         for name, _, _ in imports(path, module)} & set(known) - {module}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def strongly_connected(node: str) -> None:  # Tarjan
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                strongly_connected(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                circles.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            strongly_connected(node)
    assert not circles, circles


def test_imports_inside_functions_are_only_of_heavy_optional_dependencies():
    wrong = []
    for module, path in modules().items():
        if module.split(".")[0] in LAZY_PACKAGES:
            continue
        for name, nested, line in imports(path, module):
            if nested and name.split(".")[0] not in HEAVY:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name} inside a function")
    wrong = sorted(set(wrong))
    assert not wrong, "\n".join(wrong)


def test_the_command_line_imports_in_a_function_only_what_needs_an_extra_and_says_why():
    wrong = []
    for module, path in modules().items():
        if module.split(".")[0] not in LAZY_PACKAGES:
            continue
        lines = path.read_text().splitlines()
        for name, nested, line in imports(path, module):
            if not nested:
                continue
            if name.split(".")[0] not in HEAVY | OPTIONAL_PARTS:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name} inside a function (no extra needs it)")
            elif not _says_why(lines, line - 1):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name} inside a function without a comment")
    assert not sorted(set(wrong)), "\n".join(sorted(set(wrong)))


def _says_why(lines: list[str], index: int) -> bool:
    """A comment on the import's line, or on the line above its block of imports."""
    if "#" in lines[index]:
        return True
    while index > 0 and lines[index - 1].strip().startswith(("from ", "import ")):
        index -= 1
    return index > 0 and lines[index - 1].strip().startswith("#")


def test_the_proxys_command_line_loads_no_trainer():
    """The proxy's image has no torch: its commands (`rlproxy serve`, `engine`, `migrate`, `keys`, `prune`,
    `eval`) import nothing of the trainer or the demo."""
    code = ("import sys, rlproxy.cli; [rlproxy.cli.main.get_command(None, name) for name in "
            "('serve', 'engine', 'migrate', 'keys', 'prune', 'eval')]; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            f"set({sorted(OPTIONAL_PARTS | HEAVY)!r})))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr


def test_no_import_is_hidden_behind_importlib_in_the_product():
    """`importlib` only for a heavy optional package named in the call, or for the user's own code."""
    hidden = []
    for module, path in modules().items():
        if module.split(".")[0] not in SHIPPED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            call = re.search(r"\bimport_module\(\s*(?:([\"'])(\w+))?|__import__\(", line)
            lazy_command = path.name == "cli.py" and "rlproxy.commands." in line  # the roof loads a command
            if call and not (call.group(2) in HEAVY or "loads user code" in line or lazy_command):
                hidden.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hidden, "\n".join(hidden)


def test_the_drawing_lists_every_package_with_what_it_may_import():
    drawing = (ROOT / "docs" / "architecture.md").read_text()
    for package, allowed in LAYERS.items():
        row = re.search(rf"^\| `{package}/` \|.*$", drawing, re.MULTILINE)
        assert row, f"docs/architecture.md has no row for {package}/"
        may = set(re.findall(r"`(\w+)`", row.group(0).split("|")[3]))
        assert may == allowed, (package, may, allowed)

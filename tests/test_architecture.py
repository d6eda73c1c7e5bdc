"""The house as docs/architecture.md draws it, checked against the code itself: which package may import which
(each only the floors below it, as LAYERS lists them: core at the bottom, the command line `rlproxy` on top), no
import circles between modules, no import hidden inside a function except of an optional heavy dependency, every
top-level package of the repository placed in the plan, and the write side: SQL only in store/ and migrations/,
reward rows written only by store/rewards.py, and a policy's state (`evaluation`, its verdicts) set only there.

When this fails, either the change works against the plan (move the shared piece down a floor, the statement
into store/) or the plan changed (change docs/architecture.md and LAYERS, in tests/house.py, together)."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.house import LAYERS, OUTSIDE, PROJECT, ROOT, SHIPPED, modules, packages

# Imported inside functions on purpose: optional or heavy, so that the proxy (which has no torch) and quick
# commands start without them. Anything else is imported at the top of its module.
HEAVY = {"torch", "transformers", "peft", "safetensors", "openrlhf", "matplotlib", "datasets", "uvloop", "vllm",
         "gguf", "ctypes", "tokenizers", "mistral_common"}
# The command line imports in a function only the parts that need an optional extra (the trainer and the demo:
# torch, vLLM, openai), each command what it runs: the proxy's image has none of them, and `rlproxy serve`
# must not load the trainer. It says why where it does.
LAZY_PACKAGES = {"rlproxy"}
OPTIONAL_PARTS = {"trainer", "demo"}


def unplaced_packages(root: Path = ROOT) -> set[str]:
    """Top-level packages the plan does not place: neither a floor of the house nor outside it."""
    return packages(root) - PROJECT


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


def test_every_package_of_the_repository_has_its_place_in_the_plan(tmp_path):
    assert not unplaced_packages(), f"add {sorted(unplaced_packages())} to LAYERS (a floor) or OUTSIDE"
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "errors.py").write_text("from plugins.extra import thing\n")
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "extra.py").write_text("thing = 1\n")
    assert unplaced_packages(tmp_path) == {"plugins"}  # a new package core imports does not pass unnoticed


def test_nothing_imports_the_command_line_or_the_test_helpers():
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {name}"
             for module, path in modules().items() for name, _, line in imports(path, module)
             if name.split(".")[0] in ({"rlproxy"} - {module.split(".")[0]}) | OUTSIDE
             or (name.split(".")[0] == "testkit" and module.split(".")[0] in SHIPPED)]
    assert not wrong, "\n".join(wrong)


def test_a_route_module_imports_no_other_route_module():
    """Routes are thin handlers over serving objects (proxy/serving.py, proxy/ingest.py); what two route modules
    share lives below them (proxy/api/endpoints.py), so no route is another's library."""
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {name}"
             for module, path in modules().items() if module.startswith("proxy.routes.")
             for name, _, line in imports(path, module)
             if name.startswith("proxy.routes.") and name != module and not name.startswith(module + ".")]
    assert not wrong, "\n".join(wrong)


# The proxy's wings: folders of modules that work for the call path (app, routes, serving on proxy/'s top level)
# behind one door each, their __init__.py. docs/architecture.md names what each holds.
WINGS = ("proxy.api", "proxy.edge", "proxy.otlp", "proxy.recording")


def wing_of(module: str, wings: tuple[str, ...] = WINGS) -> str | None:
    return next((wing for wing in wings if module == wing or module.startswith(wing + ".")), None)


def imports_past_a_door(known: dict[str, Path], wings: tuple[str, ...] = WINGS, root: Path = ROOT) -> list[str]:
    """`path:line imports name` for each import of a module inside a wing from a module outside that wing
    (another wing's inside included): only the wing's door (its package) may be imported from outside."""
    wrong = []
    for module, path in known.items():
        for name, _, line in imports(path, module):
            target = name if name in known else name.rsplit(".", 1)[0]
            wing = wing_of(target, wings)
            if wing and target != wing and wing_of(module, wings) != wing:
                wrong.append(f"{path.relative_to(root)}:{line} imports {name} (only {wing} itself, its door)")
    return sorted(set(wrong))


def test_a_wing_is_entered_only_by_its_door():
    assert set(WINGS) <= set(modules()), "a wing in WINGS is no package of proxy/"
    wrong = imports_past_a_door(modules())
    assert not wrong, "\n".join(wrong)


def test_the_door_rule_sees_an_import_past_a_door(tmp_path):
    planted = {
        "proxy/wing/__init__.py": "from proxy.wing.inside import thing\n",
        "proxy/wing/inside.py": "thing = 1\n",
        "proxy/other/__init__.py": "",
        "proxy/other/inside.py": "from proxy.wing.inside import thing\n",
        "proxy/serving.py": "from proxy.wing import thing\nfrom proxy.wing.inside import thing as same\n",
    }
    known = {}
    for name, source in planted.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
        parts = Path(name).with_suffix("").parts
        known[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = tmp_path / name
    assert imports_past_a_door(known, ("proxy.wing", "proxy.other"), tmp_path) == [
        "proxy/other/inside.py:1 imports proxy.wing.inside (only proxy.wing itself, its door)",
        "proxy/other/inside.py:1 imports proxy.wing.inside.thing (only proxy.wing itself, its door)",
        "proxy/serving.py:2 imports proxy.wing.inside (only proxy.wing itself, its door)",
        "proxy/serving.py:2 imports proxy.wing.inside.thing (only proxy.wing itself, its door)",
    ]


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


# --- the write side -----------------------------------------------------------------------------------------

# Where the schema's statements may be written: the store's modules and the migrations.
SQL_OWNERS = {"store", "migrations"}
REWARD_WRITER = "store/rewards.py"
# Each place outside store/ that still issues SQL, and why it may (the rule holds for everything new):
SQL_ALLOWED = {
    # Creates and drops the tests' throwaway databases on the server, before any schema exists (not shipped).
    "testkit/processes.py",
}
SQL_BUILDERS = {"text", "select", "insert", "update", "delete"}  # sqlalchemy's statement constructors
ROW_WRITES = {"add", "add_all", "delete", "merge"}  # a session's ways to add or remove rows
RUNNERS = {"execute", "exec_driver_sql", "executemany", "scalar", "scalars"}
HOLDS_A_CONNECTION = re.compile(r"session|conn|cursor", re.IGNORECASE)
RAW_SQL = re.compile(r"^\s*(SELECT\s+(1\b|\S+.*\sFROM\s)|INSERT\s+INTO\s|UPDATE\s+\S+\s+SET\s|DELETE\s+FROM\s|"
                     r"(CREATE|DROP|ALTER)\s+(TABLE|DATABASE|INDEX|SCHEMA)\s|TRUNCATE\s|PRAGMA\s)")


def _receiver(call: ast.Call) -> str:
    """The name a method is called on (`session` in `self.session.add(x)`), '' for a plain function call."""
    target = call.func.value if isinstance(call.func, ast.Attribute) else None
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else ""


def sql_statements(path: Path) -> list[tuple[int, str]]:
    """(line, what) for each place the module builds, runs or spells out SQL, or adds or removes rows."""
    tree = ast.parse(path.read_text(), str(path))
    builders = set()  # the local names of sqlalchemy's statement constructors
    modules_ = set()  # the local names of sqlalchemy modules (`sa` in `import sqlalchemy as sa`)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
            builders |= {alias.asname or alias.name for alias in node.names if alias.name in SQL_BUILDERS}
        elif isinstance(node, ast.Import):
            modules_ |= {alias.asname or alias.name for alias in node.names if alias.name.startswith("sqlalchemy")}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in builders:
                found.append((node.lineno, f"sqlalchemy {func.id}()"))
            elif isinstance(func, ast.Attribute):
                receiver = _receiver(node)
                if func.attr in SQL_BUILDERS and receiver in modules_ | {"sqlalchemy"}:
                    found.append((node.lineno, f"sqlalchemy {func.attr}()"))
                elif func.attr in ROW_WRITES and "session" in receiver.lower():
                    found.append((node.lineno, f"{receiver}.{func.attr}()"))
                elif func.attr in RUNNERS and HOLDS_A_CONNECTION.search(receiver):
                    found.append((node.lineno, f"{receiver}.{func.attr}()"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and RAW_SQL.match(node.value):
            found.append((node.lineno, f"SQL text {node.value.strip()[:40]!r}"))
    return sorted(set(found))


def reward_rows_written(path: Path) -> list[tuple[int, str]]:
    """(line, what) for each place the module makes a reward row or writes into the rewards table."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Reward":
            found.append((node.lineno, "Reward(...)"))
        elif (isinstance(node, ast.Attribute) and node.attr == "__table__" and isinstance(node.value, ast.Name)
              and node.value.id == "Reward"):
            found.append((node.lineno, "Reward.__table__"))
    return found


# A policy's state (its verdicts, what else its row keeps in `evaluation`, its lineage and activation) changes
# only through store/ functions: set on a loaded row elsewhere, it is a read-modify-write nobody else sees.
POLICY_STATE = {"evaluation", "evidence", "promoted", "parent_score", "parent_version", "activated_at"}


def policy_state_written(path: Path) -> list[tuple[int, str]]:
    """(line, what) for each attribute of a policy's state the module sets on an object."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        found += [(node.lineno, f".{target.attr} =") for target in targets
                  if isinstance(target, ast.Attribute) and target.attr in POLICY_STATE]
    return found


def writes_outside_the_store(root: Path = ROOT) -> list[str]:
    """Every SQL statement outside store/ and migrations/ (but the allowed ones) and every reward row written
    outside store/rewards.py, as `path:line what`."""
    wrong = []
    for path in modules(root).values():
        relative = path.relative_to(root).as_posix()
        if relative.split("/")[0] not in SQL_OWNERS and relative not in SQL_ALLOWED:
            wrong += [f"{relative}:{line} {what}" for line, what in sql_statements(path)]
            wrong += [f"{relative}:{line} {what} (policy state: a store/ function)"
                      for line, what in policy_state_written(path)]
        if relative != REWARD_WRITER and relative.split("/")[0] != "migrations":
            wrong += [f"{relative}:{line} {what} (reward rows: store/rewards.py)"
                      for line, what in reward_rows_written(path)]
    return wrong


def test_only_the_store_issues_sql_and_only_store_rewards_writes_reward_rows():
    wrong = writes_outside_the_store()
    assert not wrong, "move these into a store/ function:\n" + "\n".join(wrong)


def test_the_write_rule_sees_a_statement_or_a_row_planted_outside_the_store(tmp_path):
    planted = {
        "store/calls.py": "from sqlalchemy import select\nasync def f(session):\n    await session.execute(select())\n",
        "proxy/sneaky.py": "from sqlalchemy import select as pick\nquery = pick(1)\n",
        "proxy/raw.py": "async def f(conn):\n    await conn.execute(QUERY)\nQUERY = 'DELETE FROM calls'\n",
        "trainer/rows.py": "def f(self, row):\n    self.session.add(row)\n",
        "demo/builder.py": "import sqlalchemy as sa\nstatement = sa.update(TABLE)\n",
        "store/policies.py": "from store.models import Reward\ndef f(session):\n    return Reward(value=1.0)\n",
        "store/rewards.py": "from store.models import Reward\ndef f():\n    return Reward(value=1.0)\n",
        "runner/harmless.py": "def f(items, choice):\n    items.add(choice)\n    return 'select the best one'\n",
        "trainer/verdict.py": "def f(row, record):\n    row.evaluation = {**row.evaluation, 'gate': record}\n",
        "store/verdicts.py": "def f(row):\n    row.promoted = True\n",
    }
    for name, source in planted.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(source)
    assert sorted(writes_outside_the_store(tmp_path)) == [
        "demo/builder.py:2 sqlalchemy update()",
        "proxy/raw.py:2 conn.execute()",
        "proxy/raw.py:3 SQL text 'DELETE FROM calls'",
        "proxy/sneaky.py:2 sqlalchemy pick()",
        "store/policies.py:3 Reward(...) (reward rows: store/rewards.py)",
        "trainer/rows.py:2 session.add()",
        "trainer/verdict.py:2 .evaluation = (policy state: a store/ function)",
    ]


def imports_of_test_modules(root: Path = ROOT) -> set[tuple[str, str]]:
    """(file, test module) for each import of a test module (tests/…/test_*.py) by a file under tests/."""
    found = set()
    for path in sorted((root / "tests").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for name, _, _ in imports(path, module):
            named = name.split(".")
            for end in range(2, len(named) + 1):  # `from tests.x import test_y` names tests.x.test_y
                if named[0] == "tests" and named[end - 1].startswith("test_") and name != module:
                    found.add((str(path.relative_to(root)), ".".join(named[:end])))
                    break
    return found


def test_no_test_module_is_imported_as_a_library(tmp_path):
    """What tests share lives in a conftest.py (fixtures) or a support module of tests/ (a name not starting with
    test_), so that running, moving or renaming one test module never breaks another (tests/README.md)."""
    found = imports_of_test_modules()
    assert not found, f"{sorted(found)}: share through a conftest.py fixture or a tests/ support module"
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("from tests.test_b import helper\nfrom tests import support\n")
    assert imports_of_test_modules(tmp_path) == {("tests/test_a.py", "tests.test_b")}  # the rule sees one

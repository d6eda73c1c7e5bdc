"""The house's plan as the tests read it: its floors (LAYERS, bottom first, as docs/architecture.md draws them),
what stands outside it, and its modules found on disk. tests/test_architecture.py holds the code to the plan;
tests/test_error_tree.py walks the same modules for their exceptions."""
from __future__ import annotations

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
# Outside the house: they may import anything, and nothing imports them (examples/ are agents users copy).
OUTSIDE = {"tests", "bench", "examples"}
PROJECT = set(LAYERS) | OUTSIDE


def packages(root: Path = ROOT) -> set[str]:
    """The repository's top-level Python packages: every folder holding Python code, as the filesystem has them."""
    return {path.relative_to(root).parts[0] for path in root.glob("*/**/*.py")
            if not path.relative_to(root).parts[0].startswith(".")}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the house (the packages in LAYERS found under `root`) by its dotted name."""
    found = {}
    for package in sorted(packages(root) & set(LAYERS)):
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found

"""What bench/gpu_check.py needs before it measures anything, on a machine that has only torch, transformers and
peft: which imports are missing (said in the report, not as a traceback), the trainer's settings where pydantic
is absent, and `--carry` (the pure-Python packages to copy there)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES_TO_CARRY = ("openrlhf",)


# What the trainer imports beyond the standard library (accelerate comes with peft); openrlhf is carried.
NEEDED = ("torch", "transformers", "peft", "accelerate", "safetensors", "openrlhf")


def missing_imports() -> list[str]:
    """The packages of NEEDED that do not import here, each with its error."""
    import importlib

    missing = []
    for name in NEEDED:
        try:
            importlib.import_module(name)
        except Exception as error:  # an ImportError, or a broken install raising anything else
            missing.append(f"{name} ({type(error).__name__}: {error})"[:200])
    return missing


def settings_without_pydantic() -> None:
    """Where pydantic is missing: `core.settings` as a module holding TrainingSettings alone, read from
    core/settings/training.py as a plain frozen dataclass (the same fields, defaults and properties; no validation,
    which the fixed settings of this check do not need). Only in this script's processes."""
    import dataclasses
    import types

    def field(default=dataclasses.MISSING, *, default_factory=dataclasses.MISSING, **_constraints):
        return dataclasses.field(default=default, default_factory=default_factory)

    def unchanged(*_args, **_kwargs):
        return lambda function: function

    stand_in = types.ModuleType("pydantic")
    stand_in.Field, stand_in.ConfigDict = field, dict
    stand_in.field_validator = stand_in.model_validator = unchanged
    stand_in.dataclasses = types.ModuleType("pydantic.dataclasses")
    stand_in.dataclasses.dataclass = lambda config=None, **options: dataclasses.dataclass(**options)
    source = ROOT / "core" / "settings" / "training.py"
    module = types.ModuleType("core.settings.training")
    module.__file__ = str(source)
    saved = {name: sys.modules.get(name) for name in ("pydantic", "pydantic.dataclasses")}
    sys.modules.update({"pydantic": stand_in, "pydantic.dataclasses": stand_in.dataclasses})
    sys.modules["core.settings.training"] = module
    try:
        exec(compile(source.read_text(), str(source), "exec"), module.__dict__)
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    package = types.ModuleType("core.settings")
    package.__path__ = []
    package.TrainingSettings, package.training = module.TrainingSettings, module
    sys.modules["core.settings"] = package


def carry(target: Path) -> None:
    """Copy the pure-Python packages the trainer imports beyond torch, transformers and peft into `target`."""
    import importlib.util

    target.mkdir(parents=True, exist_ok=True)
    for name in PACKAGES_TO_CARRY:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            sys.exit(f"{name} is not installed here; nothing to carry")
        source = Path(next(iter(spec.submodule_search_locations)))
        shutil.copytree(source, target / name, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    print(f"carried {', '.join(PACKAGES_TO_CARRY)} into {target} ({size / 2**20:.1f} MiB)")

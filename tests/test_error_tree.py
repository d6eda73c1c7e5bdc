"""One exception tree: every exception class the project defines derives from core/errors.py's `RlproxyError`,
so a caller can tell "rlproxy said no" apart from bugs and from the libraries' own errors, and core/errors.py's
drawing of the tree names each branch."""
from __future__ import annotations

import importlib
import inspect
import re

from core.errors import RlproxyError
from tests.house import ROOT, modules

# Alembic's environment script runs the migrations when it is imported; it defines no exception.
NOT_IMPORTED = {"migrations.env"}


def project_exceptions() -> dict[str, type[BaseException]]:
    """module.Class -> class, for every exception class defined in a module of the house."""
    found = {}
    for name in sorted(set(modules()) - NOT_IMPORTED):
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and issubclass(cls, BaseException):
                found[f"{name}.{cls.__name__}"] = cls
    return found


def test_every_exception_the_project_defines_joins_the_one_tree():
    exceptions = project_exceptions()
    assert "runner.errors.RunInputError" in exceptions and "trainer.judge.JudgeUnreachable" in exceptions
    outside = sorted(name for name, cls in exceptions.items() if not issubclass(cls, RlproxyError))
    assert not outside, f"derive these from core.errors.RlproxyError (and the built-in kind callers catch): {outside}"


def test_the_drawing_of_the_tree_names_each_module_that_defines_a_branch():
    drawing = (ROOT / "core" / "errors.py").read_text()
    drawn = set(re.findall(r"\b(\w+(?:/\w+)+\.py)\b", drawing))
    defining = {name.rsplit(".", 1)[0].replace(".", "/") + ".py" for name in project_exceptions()}
    defining.discard("core/errors.py")
    assert defining - drawn == set(), f"core/errors.py does not draw the exceptions of {sorted(defining - drawn)}"

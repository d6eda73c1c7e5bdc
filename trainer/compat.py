"""Import OpenRLHF's model pieces on a machine without its CUDA-only dependencies.

`openrlhf.models` imports `flash_attn` (for sample packing / ring attention), `deepspeed` (ZeRO-3
helpers) and, through `openrlhf.utils`, `pylatexenc` (math grading) at module load. None of them is
used by what we call on CPU: `Actor` without `packing_samples`, `PolicyLoss`, `compute_approx_kl`,
`masked_mean`.

So: every dependency that really imports is used as is (a CUDA machine gets the real thing). For
each one that does not, a stub module is placed in `sys.modules` *only while openrlhf.models is
being imported* and removed right after, so nothing else in the process can mistake it for the real
package. The stub holds only the names OpenRLHF binds at import time; calling any of them raises
`MissingDependencyError` naming the package. After the import, OpenRLHF's own lazy imports (e.g.
the optional flash-attn cross-entropy kernel) fail with a normal ImportError, which it handles.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from core.errors import RlproxyError


class MissingDependencyError(RlproxyError, RuntimeError):
    """An OpenRLHF code path needing a package that is not installed here was called."""


# package -> {submodule (relative, "" = the package itself) -> names bound or touched at import}.
# Only the names OpenRLHF uses; keep this list minimal so a new use fails loudly in tests.
_IMPORT_TIME_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "flash_attn": {
        "": (),
        "bert_padding": ("index_first_axis", "pad_input", "rearrange", "unpad_input"),
        "utils": (),
        "utils.distributed": ("all_gather",),
    },
    "deepspeed": {
        "": (),
        "utils": ("set_z3_leaf_modules",),
        "zero": ("GatheredParameters", "Init"),
    },
    "pylatexenc": {
        "": (),
        "latex2text": ("LatexNodes2Text",),
    },
}

_lock = threading.Lock()


class OpenRLHFParts(NamedTuple):
    Actor: type
    PolicyLoss: type
    compute_approx_kl: Callable[..., Any]
    masked_mean: Callable[..., Any]


def _is_importable(package: str) -> bool:
    if package in sys.modules:
        return True
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _unavailable(package: str, qualname: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise MissingDependencyError(
            f"{qualname} was called, but {package!r} is not installed: trainer/compat.py only stubs it so "
            f"that openrlhf.models imports on CPU. This code path (sample packing, ring attention, "
            f"DeepSpeed ZeRO-3 or math grading) needs the real package."
        )

    fail.__name__ = fail.__qualname__ = qualname.rsplit(".", 1)[-1]
    return fail


def _build_stub(package: str) -> dict[str, types.ModuleType]:
    """Stub modules for `package`, keyed by their full dotted names, parents linked to children."""
    modules: dict[str, types.ModuleType] = {}
    for rel in sorted(_IMPORT_TIME_NAMES[package], key=len):  # parents before children
        name = f"{package}.{rel}" if rel else package
        module = types.ModuleType(name, f"CPU stand-in for {name} (see trainer/compat.py).")
        # A real spec: importlib.util.find_spec() on a sys.modules entry whose __spec__ is None raises.
        module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
        module.__path__ = []
        module.__rlproxy_stub__ = True
        for attr in _IMPORT_TIME_NAMES[package][rel]:
            setattr(module, attr, _unavailable(package, f"{name}.{attr}"))
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
        modules[name] = module
    return modules


@contextmanager
def _temporary_stubs(packages: list[str]) -> Iterator[None]:
    stubs: dict[str, types.ModuleType] = {}
    for package in packages:
        stubs.update(_build_stub(package))
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for name, module in stubs.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


def missing_packages() -> list[str]:
    """The import-time dependencies of openrlhf.models that are not installed (and would be stubbed)."""
    return [p for p in _IMPORT_TIME_NAMES if not _is_importable(p)]


def import_openrlhf() -> OpenRLHFParts:
    """Import OpenRLHF's Actor, PolicyLoss, compute_approx_kl and masked_mean (stubbing CUDA-only deps)."""
    with _lock:
        if "openrlhf.models" not in sys.modules:
            # Import the real stack first, so nothing of theirs ever sees a stub.
            import peft  # noqa: F401
            import transformers  # noqa: F401

            with _temporary_stubs(missing_packages()):
                importlib.import_module("openrlhf.models")
        from openrlhf.models import Actor, PolicyLoss
        from openrlhf.models.utils import compute_approx_kl, masked_mean

    return OpenRLHFParts(Actor, PolicyLoss, compute_approx_kl, masked_mean)

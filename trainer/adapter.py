"""Save and load the LoRA adapter so that a reader (vLLM loading it at run time) never sees half of one.

A save writes everything into a temporary directory beside the target, fsyncs it, then renames it into
place. Replacing an existing adapter swaps the two directories in one step where the kernel can
(Linux renameat2 RENAME_EXCHANGE); elsewhere the old one is moved aside first, so the target is briefly
absent but never partial. Publishing each policy version to a fresh directory avoids even that.

Files: adapter_config.json + adapter_model.safetensors (what vLLM and peft read), optimizer.pt and
trainer_state.json (what resuming reads; vLLM ignores them). Both hold whole tensors, however many ranks the
trainer that wrote them had (trainer/sharding.py): an adapter saved by 8 ranks resumes on 1, and the reverse.

With a `serving_dtype` (bfloat16, where the engines serve bf16 and the trainer computes in it: on GPUs),
adapter_model.safetensors is a copy in that dtype, half of what every replica reads over shared storage and the
publish hashes (engine/fleet.py), and the float32 master weights training goes on from are in
adapter_master.safetensors, beside optimizer.pt among the files no engine reads (`RESUME_ONLY` there). An engine in
bf16 casts a float32 adapter to bf16 as it loads it: it serves the same numbers either way.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from core.errors import RlproxyError

from trainer.sharding import load_lora_weights, lora_weights, place_optimizer_state

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MASTER_WEIGHTS = "adapter_master.safetensors"  # float32, when the served copy is in a smaller dtype
OPTIMIZER_STATE = "optimizer.pt"
TRAINER_STATE = "trainer_state.json"


def adapter_config(model: Any, base_model_name_or_path: str | None = None) -> dict[str, Any]:
    """`model`'s peft LoRA config as vLLM takes it: plain LoRA, target_modules a list, no modules_to_save."""
    config = model.peft_config["default"].to_dict()
    config.update(
        base_model_name_or_path=str(base_model_name_or_path or config.get("base_model_name_or_path") or ""),
        target_modules=sorted(config["target_modules"]) if not isinstance(config["target_modules"], str)
        else config["target_modules"],
        modules_to_save=None,
        inference_mode=True,
        peft_type="LORA",
    )
    unsupported = {k: config.get(k) for k in ("use_dora", "lora_bias") if config.get(k)}
    if unsupported:
        raise ValueError(f"vLLM cannot load this adapter: {unsupported}")
    return json.loads(json.dumps(config, default=_json_default))


def save_adapter_atomically(
    model: Any,
    optimizer_state: Mapping[str, Any] | None,
    target_dir: str | os.PathLike[str],
    *,
    base_model_name_or_path: str | None = None,
    trainer_state: Mapping[str, Any] | None = None,
    weights: Mapping[str, torch.Tensor] | None = None,
    serving_dtype: torch.dtype | None = None,
) -> Path:
    """Write the adapter of peft `model` (+ optimizer state) to `target_dir`, all or nothing. `weights`: the
    adapter's tensors when already gathered (trainer/sharding.py's `lora_weights`); by default taken from `model`.
    `serving_dtype`: the dtype of the copy engines load, the weights as they are kept in MASTER_WEIGHTS."""
    target = Path(target_dir).absolute()
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # mkdtemp makes the folder 0700, and each file is made 0600: a trained adapter is the owner's only (the
    # engines that load it run as the same user: the Docker image and the Helm chart run everything as one).
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        weights = lora_weights(model) if weights is None else weights
        _write_json(tmp / ADAPTER_CONFIG, adapter_config(model, base_model_name_or_path))
        served = weights
        if serving_dtype is not None and any(t.dtype != serving_dtype for t in weights.values()):
            served = {name: t.to(serving_dtype) for name, t in weights.items()}
            _write_weights(weights, tmp / MASTER_WEIGHTS)
        _write_weights(served, tmp / ADAPTER_WEIGHTS)
        if optimizer_state is not None:
            torch.save(dict(optimizer_state), tmp / OPTIMIZER_STATE)
        _write_json(tmp / TRAINER_STATE, dict(trainer_state or {}))
        for path in tmp.iterdir():
            path.chmod(0o600)
            _fsync(path)
        _fsync(tmp)
        _move_into_place(tmp, target)
        _fsync(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


class AdapterMismatch(RlproxyError, ValueError):
    """A saved adapter the trainer cannot go on from: made with another rank, alpha or target modules."""


def load_adapter(
    model: Any, adapter_dir: str | os.PathLike[str], optimizer: torch.optim.Optimizer | None = None
) -> dict[str, Any]:
    """Load a saved adapter into peft `model` (same rank/alpha/targets) and, if given, the optimizer state; with
    sharded parameters each rank keeps its shard (every rank reads the folder).

    Returns the saved trainer state (empty if none).
    """
    adapter_dir = Path(adapter_dir)
    saved = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
    ours = adapter_config(model)
    for key in ("r", "lora_alpha", "target_modules", "use_rslora"):
        if saved.get(key) != ours.get(key):
            raise AdapterMismatch(f"the adapter in {adapter_dir} has {key}={saved.get(key)!r} and the trainer's "
                                  f"settings make {ours.get(key)!r}: train on with the settings it was made with, "
                                  "or start a new line in another --adapters-dir")
    try:
        # the float32 master where the served copy is smaller; where retention dropped it, the served copy
        master = adapter_dir / MASTER_WEIGHTS
        load_lora_weights(model, load_file(str(master if master.exists() else adapter_dir / ADAPTER_WEIGHTS)))
    except ValueError as exc:
        raise ValueError(f"{adapter_dir}: {exc}") from None
    if optimizer is not None and (adapter_dir / OPTIMIZER_STATE).exists():
        optimizer.load_state_dict(torch.load(adapter_dir / OPTIMIZER_STATE, map_location="cpu"))
        place_optimizer_state(optimizer)
    state_path = adapter_dir / TRAINER_STATE
    return json.loads(state_path.read_text()) if state_path.exists() else {}


def _write_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file(tensors, str(path), metadata={"format": "pt"})


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if hasattr(obj, "value"):  # enums (peft's PeftType, TaskType)
        return obj.value
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _move_into_place(tmp: Path, target: Path) -> None:
    if not target.exists():
        os.rename(tmp, target)
        return
    if _exchange(tmp, target):  # tmp now holds the old adapter
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.rename(target, old / "adapter")
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old / "adapter", target)  # put the old adapter back
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))

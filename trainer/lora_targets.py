"""Which modules LoRA adapts, found from the model's architecture rather than assumed: the linear layers of its
decoder layers, by the names that architecture uses, without a mixture of experts' experts and router (vLLM
serves LoRA on the dense projections; the experts of Qwen3-MoE and gpt-oss are fused tensors, not linear layers,
and a router is not adapted).

    architecture_targets("/models/Qwen3-8B")
    # {'attention': ['k_proj', 'o_proj', 'q_proj', 'v_proj'], 'mlp': ['down_proj', 'gate_proj', 'up_proj']}
    resolve_targets("/models/Qwen3-8B", ["q_proj", "v_proj"])   # checked against them
    resolve_targets("/models/Qwen3-8B", ["auto"])               # attention and dense MLP, as found

The model is built on the meta device from its config.json: no weights are read.
"""
from __future__ import annotations

from pathlib import Path

from core.errors import RlproxyError

AUTO = "auto"
EXPERT_PARTS = ("experts", "router")  # under a mixture of experts' block: never adapted


class UnknownTargetModules(RlproxyError, ValueError):
    """target_modules names a module the model's architecture does not have."""


def _linear_names(model_path: str | Path) -> dict[str, set[str]]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    found: dict[str, set[str]] = {"attention": set(), "mlp": set(), "skipped": set()}
    for name, module in model.named_modules():
        parts = name.split(".")
        if not isinstance(module, torch.nn.Linear) or "layers" not in parts:
            continue
        moe = any(part in EXPERT_PARTS for part in parts) or (parts[-1] == "gate" and _has_experts(model, parts))
        kind = "skipped" if moe else "attention" if any("attn" in part for part in parts) else "mlp"
        found[kind].add(parts[-1])
    return found


def _has_experts(model, parts: list[str]) -> bool:
    parent = model.get_submodule(".".join(parts[:-1]))
    return hasattr(parent, "experts")


def architecture_targets(model_path: str | Path) -> dict[str, list[str]]:
    """The adaptable linear layers' names of the model's decoder layers: attention and dense MLP ones, and the
    mixture-of-experts ones left out (`skipped`)."""
    return {kind: sorted(names) for kind, names in _linear_names(model_path).items()}


def resolve_targets(model_path: str | Path, wanted: list[str]) -> list[str]:
    """`wanted` checked against the architecture (`["auto"]`: every attention and dense MLP projection found)."""
    found = architecture_targets(model_path)
    adaptable = found["attention"] + found["mlp"]
    if list(wanted) == [AUTO]:
        return adaptable
    missing = [name for name in wanted if name not in adaptable]
    if missing:
        raise UnknownTargetModules(
            f"target_modules {missing} are not linear layers of this model's decoder layers; it has attention "
            f"{found['attention']} and MLP {found['mlp']}" + (
                f" (left out: mixture-of-experts {found['skipped']})" if found["skipped"] else "")
            + "; or set target_modules=[\"auto\"]")
    return list(wanted)

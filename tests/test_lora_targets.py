"""LoRA's target modules come from the model's architecture: each family's attention and MLP projections by
their own names, a mixture of experts' fused experts and router never adapted, and a name the model lacks
refused with the names it has (peft's own error only says that no module matched)."""
from __future__ import annotations

import pytest

from trainer.lora_targets import UnknownTargetModules, architecture_targets, resolve_targets

pytest.importorskip("transformers")
pytestmark = pytest.mark.train

DENSE = {"attention": ["k_proj", "o_proj", "q_proj", "v_proj"], "mlp": ["down_proj", "gate_proj", "up_proj"],
         "skipped": []}


@pytest.mark.parametrize("family", ["qwen3", "llama3", "mistral"])
def test_each_dense_family_adapts_its_attention_and_mlp_projections(family_model, family):
    assert architecture_targets(family_model(family)) == DENSE
    assert resolve_targets(family_model(family), ["auto"]) == DENSE["attention"] + DENSE["mlp"]
    assert resolve_targets(family_model(family), ["q_proj", "v_proj"]) == ["q_proj", "v_proj"]


def tiny_moe(tmp_path, kind: str):
    from transformers import GptOssConfig, Qwen3MoeConfig

    sizes = dict(vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, num_experts_per_tok=2)
    config = (Qwen3MoeConfig(moe_intermediate_size=32, num_experts=4, **sizes) if kind == "qwen3_moe"
              else GptOssConfig(num_local_experts=4, **sizes))
    config.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("kind", ["qwen3_moe", "gpt_oss"])
def test_a_mixture_of_experts_adapts_its_attention_only(tmp_path, kind):
    folder = tiny_moe(tmp_path, kind)
    assert resolve_targets(folder, ["auto"]) == DENSE["attention"]
    with pytest.raises(UnknownTargetModules, match=r"\['gate_proj'\] are not linear layers .* MLP \[\]"):
        resolve_targets(folder, ["q_proj", "gate_proj"])


def test_a_name_the_model_lacks_is_refused_with_the_names_it_has(family_model):
    with pytest.raises(UnknownTargetModules, match=r"\['c_attn'\] .* attention \['k_proj', 'o_proj', 'q_proj'"):
        resolve_targets(family_model("llama3"), ["c_attn", "q_proj"])

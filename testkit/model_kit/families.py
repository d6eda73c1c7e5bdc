"""The model families the kit builds, each as the pieces a served model folder is made of: the architecture
(a transformers config at tiny sizes), the real vocabulary and special-token ids, the chat template, the
tokens that end a turn and the ids generation stops at (generation_config.json's `eos_token_id`, which vLLM
reads even with `--generation-config vllm`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from testkit.model_kit.templates import GPT_OSS, LLAMA3, QWEN3
from testkit.model_kit.vocab import Vocabulary, package_dir, quicktok_data, read_ranks, read_specials

# Qwen's pre-tokenizer: Llama 3's with digits one at a time (\p{N} where Llama 3 has \p{N}{1,3}).
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                  r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
O200K_PATTERN = (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|"""
                 r"""'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|"""
                 r"""'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
# quicktok names Llama 3.0's reserved tokens; Llama 3.1 onwards (3.2's 1B/3B included) use three of those ids.
LLAMA31_NAMES = {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"}

# Tiny sizes: vLLM's CPU attention needs head_dim 64 or more (16 is refused).
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=64, max_position_embeddings=4096)


@dataclass(frozen=True)
class Family:
    name: str
    architecture: str                 # the transformers config class
    vocab_size: int                   # the embedding rows (Qwen pads past its tokens)
    vocabulary: str                   # a key of VOCABULARIES
    chat_template: str | None         # None: the tokenizer renders chats itself (mistral_common)
    bos: str | None
    eos: str                          # the tokenizer's end-of-turn token
    stop: tuple[str, ...]             # every token generation ends at
    pad: str | None = None
    config: dict = field(default_factory=dict)


def qwen3_vocabulary() -> Vocabulary:
    data = quicktok_data()
    return Vocabulary(read_ranks(data / "qwen3.vocab"), QWEN_PATTERN, read_specials(data / "qwen3.special"))


def llama3_vocabulary() -> Vocabulary:
    data = quicktok_data()
    specials = {**read_specials(data / "llama3.special"), **LLAMA31_NAMES}
    return Vocabulary(read_ranks(data / "llama3.vocab"), LLAMA3_PATTERN, specials)


def harmony_vocabulary() -> Vocabulary:
    data = quicktok_data()
    return Vocabulary(read_ranks(data / "o200k.vocab"), O200K_PATTERN, read_specials(data / "o200k_harmony.special"))


def tekken_file() -> Path:
    """Mistral's tekken vocabulary, as mistral_common ships it (the newest tekken file of the package)."""
    files = sorted((package_dir("mistral_common", "mistral_common") / "data").glob("tekken_*.json"))
    if not files:
        raise FileNotFoundError("mistral_common ships no tekken_*.json")
    return files[-1]


VOCABULARIES = {"qwen3": qwen3_vocabulary, "llama3": llama3_vocabulary, "o200k_harmony": harmony_vocabulary}

FAMILIES: dict[str, Family] = {
    "qwen3": Family("qwen3", "Qwen3Config", 151936, "qwen3", QWEN3, bos=None, eos="<|im_end|>",
                    stop=("<|im_end|>", "<|endoftext|>"), pad="<|endoftext|>",
                    config=dict(tie_word_embeddings=True, rope_theta=1_000_000.0)),
    "llama3": Family("llama3", "LlamaConfig", 128256, "llama3", LLAMA3, bos="<|begin_of_text|>",
                     eos="<|eot_id|>", stop=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
                     pad="<|finetune_right_pad_id|>", config=dict(tie_word_embeddings=True, rope_theta=500_000.0)),
    "mistral": Family("mistral", "MistralConfig", 131072, "tekken", None, bos="<s>", eos="</s>", stop=("</s>",),
                      config=dict(tie_word_embeddings=False, rope_theta=1_000_000.0, sliding_window=None)),
    # gpt-oss: a mixture of 4 experts (2 a token), sliding and full attention layers in turn, attention sinks
    "gpt-oss": Family("gpt-oss", "GptOssConfig", 201088, "o200k_harmony", GPT_OSS, bos="<|startoftext|>",
                      eos="<|return|>", stop=("<|return|>", "<|endoftext|>", "<|call|>"), pad="<|endoftext|>",
                      config=dict(tie_word_embeddings=False, num_local_experts=4, num_experts_per_tok=2,
                                  sliding_window=128, layer_types=["sliding_attention", "full_attention"])),
}

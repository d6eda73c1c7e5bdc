"""Tiny randomly initialised models of other families with their real vocabularies, for tests and benches:

    from testkit.model_kit import build_model
    folder = build_model("qwen3")          # or "llama3", "mistral", "gpt-oss"; cached by family, seed, kit version
    # a Hugging Face folder vLLM serves: config.json, model.safetensors (seeded random weights), the family's
    # tokenizer with its real ids, its chat template (testkit/model_kit/templates.py), generation_config.json
    # with the ids generation stops at; gpt-oss's also holds harmony/o200k_base.tiktoken (testkit/model_kit/harmony.py)

The vocabularies come from registry packages (testkit/model_kit/vocab.py), the architecture from transformers'
config classes at tiny sizes (2 layers, hidden 128, head_dim 64, gpt-oss with 4 experts: vLLM on CPU starts one
in one to three minutes),
the chat templates are this project's (testkit/model_kit/families.py says what each family does). Weights are
random: log-probs are near uniform, which every exactness, parser, merge and training-step check tolerates;
only learning needs real weights.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from testkit.model_kit.families import FAMILIES, TINY, VOCABULARIES, Family, tekken_file
from testkit.model_kit.harmony import write_encoding
from testkit.model_kit.vocab import fast_tokenizer

HARMONY_FOLDER = "harmony"  # gpt-oss: o200k_base.tiktoken for openai_harmony (engine/families.py family_env)

KIT_VERSION = 1
CACHE_ENV = "RLPROXY_MODEL_KIT_CACHE"

__all__ = ["FAMILIES", "Family", "build_model", "kit_key"]


def kit_key(family: Family, seed: int) -> str:
    """The folder name of a built model: what it was built from, so a changed template or size rebuilds it."""
    digest = hashlib.sha256(json.dumps([KIT_VERSION, family.name, family.chat_template, family.config, TINY,
                                        family.stop, seed], sort_keys=True).encode()).hexdigest()[:12]
    return f"{family.name}-tiny-s{seed}-{digest}"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rlproxy" / "model-kit")


def build_model(name: str, root: Path | None = None, *, seed: int = 0) -> Path:
    """The folder of family `name`'s tiny model, built once (atomically: a rename) and reused after."""
    if name not in FAMILIES:
        raise KeyError(f"unknown model family {name!r}; the kit builds {sorted(FAMILIES)}")
    family = FAMILIES[name]
    root = Path(root or cache_root())
    folder = root / kit_key(family, seed)
    if (folder / "config.json").exists():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    try:
        _write_model(family, building, seed)
        try:
            building.rename(folder)
        except OSError:  # built meanwhile by another process
            if not (folder / "config.json").exists():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return folder


def _write_model(family: Family, out: Path, seed: int) -> None:
    ids = _write_tokenizer(family, out)
    import torch
    import transformers

    config_class = getattr(transformers, family.architecture)
    config = config_class(vocab_size=family.vocab_size, bos_token_id=ids.get(family.bos),
                          eos_token_id=ids[family.eos], pad_token_id=ids.get(family.pad),
                          dtype="float32", **TINY, **family.config)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    stops = [ids[token] for token in family.stop]
    generation = {"bos_token_id": ids.get(family.bos), "eos_token_id": stops if len(stops) > 1 else stops[0]}
    (out / "generation_config.json").write_text(json.dumps({k: v for k, v in generation.items() if v is not None},
                                                           indent=2) + "\n")


def _write_tokenizer(family: Family, out: Path) -> dict[str, int]:
    """The tokenizer files; returns the ids of the family's named tokens (bos, eos, pad, stops)."""
    out.mkdir(parents=True, exist_ok=True)
    named = {t for t in (family.bos, family.eos, family.pad, *family.stop) if t}
    if family.vocabulary == "tekken":
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer

        shutil.copyfile(tekken_file(), out / "tekken.json")
        tekken = Tekkenizer.from_file(out / "tekken.json")
        return {token: tekken.get_special_token(token) for token in named}
    from transformers import PreTrainedTokenizerFast

    vocabulary = VOCABULARIES[family.vocabulary]()
    if family.vocabulary == "o200k_harmony":  # what vLLM's harmony renderer reads (TIKTOKEN_ENCODINGS_BASE)
        write_encoding(out / HARMONY_FOLDER, vocabulary.ranks)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=fast_tokenizer(vocabulary),
                                        bos_token=family.bos, eos_token=family.eos, pad_token=family.pad,
                                        add_bos_token=False, clean_up_tokenization_spaces=False,
                                        model_max_length=TINY["max_position_embeddings"])
    tokenizer.chat_template = family.chat_template
    tokenizer.save_pretrained(out)
    return {token: tokenizer.convert_tokens_to_ids(token) for token in named}

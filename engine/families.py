"""Which model family a model folder holds, and what vLLM needs to serve that family's calls the way its chat
template writes them: the tool-call parser, the reasoning parser, the tokenizer mode and the ids generation stops
at. `rlproxy engine` (engine/command.py) passes them; the operator overrides any of them with EngineSettings'
`model_family`, `tool_call_parser`, `reasoning_parser` and `chat_template` (docs/deploy.md, "Model families").

    plan = serving_plan(Path("/models/Llama-3.2-3B-Instruct"))
    plan.family.name, plan.tool_call_parser, plan.stop_ids     # 'llama3', 'llama3_json', (128001, 128008, 128009)

The family is read from the folder, never from its name: `config.json`'s `model_type`, the tokenizer's special
tokens (Llama 3's `<|eot_id|>` tells it from the Llama-architecture ChatML models such as the bundled SmolLM2),
and Mistral's `tekken.json`. A folder of no known family is served as before (hermes tool calls, no reasoning)
and says so.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from core.errors import RlproxyError

NONE = "none"  # an override that turns a parser off
HARMONY_ENCODINGS = "harmony"  # gpt-oss: the folder in the model folder holding openai_harmony's o200k file


class UnknownFamily(RlproxyError, ValueError):
    """An operator named a family this module does not know."""


@dataclass(frozen=True)
class Family:
    name: str
    tool_call_parser: str | None      # vLLM's --tool-call-parser name
    reasoning_parser: str | None      # vLLM's --reasoning-parser name
    tokenizer_mode: str | None = None  # vLLM's --tokenizer-mode, where the family needs its own
    end_tokens: tuple[str, ...] = ()  # tokens a turn may end with: generation must stop at each
    about: str = ""


FAMILIES = {family.name: family for family in (
    Family("qwen3", "hermes", "qwen3", end_tokens=("<|im_end|>",),
           about="Qwen3: <tool_call> JSON blocks (hermes), <think> reasoning"),
    Family("llama3", "llama3_json", None, end_tokens=("<|eot_id|>", "<|eom_id|>"),
           about="Llama 3.x: bare JSON tool calls with parameters, several end tokens"),
    Family("mistral", "mistral", None, tokenizer_mode="mistral",
           about="Mistral: tekken tokenizer, chats rendered by mistral_common, [TOOL_CALLS]"),
    Family("gpt-oss", "openai", "openai_gptoss", end_tokens=("<|return|>", "<|call|>"),
           about="gpt-oss: the harmony format (analysis and final channels)"),
    Family("chatml", "hermes", None, end_tokens=("<|im_end|>",),
           about="ChatML without reasoning (the bundled SmolLM2)"),
)}
FALLBACK = Family("unknown", "hermes", None, about="no known family: served as a ChatML model")


@dataclass(frozen=True)
class ServingPlan:
    family: Family
    detected_from: str
    tool_call_parser: str | None
    reasoning_parser: str | None
    tokenizer_mode: str | None
    chat_template: Path | None
    stop_ids: tuple[int, ...]          # what the engine stops at: the tokenizer's eos and generation_config's
    missing_end_tokens: tuple[str, ...]  # the family's end tokens it would not stop at
    env: tuple[tuple[str, str], ...] = ()  # environment the engine needs for the family (set where not set)

    def args(self) -> list[str]:
        """vLLM's flags for this plan."""
        args = []
        if self.tool_call_parser:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        if self.reasoning_parser:
            args += ["--reasoning-parser", self.reasoning_parser]
        if self.tokenizer_mode:
            args += ["--tokenizer-mode", self.tokenizer_mode]
        if self.chat_template:
            args += ["--chat-template", str(self.chat_template)]
        return args

    def describe(self) -> str:
        line = (f"model family {self.family.name} ({self.detected_from}): tool-call parser "
                f"{self.tool_call_parser or NONE}, reasoning parser {self.reasoning_parser or NONE}, stops at ids "
                f"{list(self.stop_ids)}")
        if self.missing_end_tokens:
            line += (f"; it would not stop at {', '.join(self.missing_end_tokens)}: add their ids to "
                     "generation_config.json's eos_token_id in the model folder")
        return line


def family_env(family: Family, folder: Path) -> tuple[tuple[str, str], ...]:
    """gpt-oss: vLLM renders its chats with openai_harmony, which downloads `o200k_base.tiktoken` at the first
    chat unless TIKTOKEN_ENCODINGS_BASE names a folder holding it; a model folder with a `harmony/` folder holding
    that file (testkit/model_kit writes one; an offline operator copies it there) is served from it."""
    encodings = Path(folder) / HARMONY_ENCODINGS
    if family.name == "gpt-oss" and (encodings / "o200k_base.tiktoken").is_file():
        return (("TIKTOKEN_ENCODINGS_BASE", str(encodings)),)
    return ()


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _special_tokens(folder: Path) -> dict[str, int]:
    """The tokenizer's added (special) tokens by text, from tokenizer.json, else tokenizer_config.json."""
    added = _read_json(folder / "tokenizer.json").get("added_tokens") or []
    found = {token["content"]: token["id"] for token in added if "content" in token and "id" in token}
    if not found:
        decoder = _read_json(folder / "tokenizer_config.json").get("added_tokens_decoder") or {}
        found = {entry.get("content"): int(token_id) for token_id, entry in decoder.items() if entry.get("content")}
    return found


def _mistral_tokenizer(folder: Path) -> bool:
    """A tokenizer file mistral_common reads (vLLM's `--tokenizer-mode mistral` then renders the chats)."""
    return (folder / "tekken.json").exists() or any(folder.glob("tokenizer.model.v*"))


def detect_family(folder: Path) -> tuple[Family, str]:
    """The family of the model in `folder` and what told it."""
    folder = Path(folder)
    config = _read_json(folder / "config.json")
    model_type = str(config.get("model_type") or "")
    if _mistral_tokenizer(folder):
        return FAMILIES["mistral"], "a Mistral tokenizer file (tekken.json or tokenizer.model.v*)"
    specials = _special_tokens(folder)
    if model_type.startswith("qwen3"):
        return FAMILIES["qwen3"], f"config.json model_type {model_type}"
    if model_type == "gpt_oss":
        return FAMILIES["gpt-oss"], "config.json model_type gpt_oss"
    if "<|eot_id|>" in specials and "<|start_header_id|>" in specials:
        return FAMILIES["llama3"], f"config.json model_type {model_type or '?'} and the <|eot_id|> token"
    if model_type == "mistral":
        return FAMILIES["mistral"], "config.json model_type mistral"
    if "<|im_start|>" in specials:
        return FAMILIES["chatml"], f"config.json model_type {model_type or '?'} and the <|im_start|> token"
    return FALLBACK, f"config.json model_type {model_type or '?'} is of no known family"


def stop_ids(folder: Path) -> tuple[int, ...]:
    """The ids vLLM stops at for this folder: config.json's eos_token_id and generation_config.json's (vLLM
    reads the latter even under --generation-config vllm: vllm/v1/engine/input_processor.py)."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        value = _read_json(Path(folder) / name).get("eos_token_id")
        ids.update([value] if isinstance(value, int) else [v for v in value or () if isinstance(v, int)])
    return tuple(sorted(ids))


def _override(value: str | None, default: str | None) -> str | None:
    if value is None:
        return default
    return None if value == NONE else value


def serving_plan(folder: Path, *, family: str | None = None, tool_call_parser: str | None = None,
                 reasoning_parser: str | None = None, chat_template: Path | None = None) -> ServingPlan:
    """What to serve `folder` with: its family's parsers, each replaced by the operator's value where given
    (`none` turns a parser off)."""
    if family is not None:
        if family not in FAMILIES:
            raise UnknownFamily(f"unknown model family {family!r}: one of {', '.join(FAMILIES)}")
        chosen, source = FAMILIES[family], "set by the operator"
    else:
        chosen, source = detect_family(folder)
    stops = stop_ids(folder)
    mode = chosen.tokenizer_mode if _mistral_tokenizer(Path(folder)) else None
    specials = _special_tokens(folder)
    missing = tuple(token for token in chosen.end_tokens if token in specials and specials[token] not in stops)
    return ServingPlan(chosen, source, _override(tool_call_parser, chosen.tool_call_parser),
                       _override(reasoning_parser, chosen.reasoning_parser), mode,
                       chat_template, stops, missing, family_env(chosen, Path(folder)))

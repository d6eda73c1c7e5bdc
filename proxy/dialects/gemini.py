"""The Gemini API (`POST …/v1beta/models/{model}:generateContent` and `:streamGenerateContent?alt=sse`,
proxy/routes/gemini.py), translated to and from the engine's chat route.

The conversation is core/gemini_chat.py's chat form of `systemInstruction` and `contents`; function declarations
are chat functions and `toolConfig.functionCallingConfig` the tool choice (AUTO `auto`, ANY `required`, or the
one function of `allowedFunctionNames`, NONE `none`; several allowed names offer only those functions);
`generationConfig` is the sampling (temperature, topP, topK, maxOutputTokens as max_tokens, stopSequences as
stop, candidateCount as n, seed, presence and frequency penalties) and JSON output (`responseMimeType`
application/json, with `responseSchema` or `responseJsonSchema` as the schema). What the API knows but no engine
here does (server tools such as googleSearch, code execution, cached content, audio or image output, media other
than images, log-probabilities in the answer) is refused naming it, rather than dropped from the prompt or the
answer unseen; what only tunes Google's own service (safetySettings, labels, serviceTier, mediaResolution) is
recorded as sent. The answer is made by proxy/dialects/gemini_stream.py, whole or as the event stream.

The two routes are two dialects of one recorded route, `gemini`: one answers whole, the other streams (the API
says so in the path, not the body). Errors on these routes use Google's shape (proxy/dialects/gemini_objects.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from core.gemini_chat import chat_messages, chat_tools, json_schema
from proxy.capture import CHAT, Additions
from proxy.dialects.base import engine_error_message
from proxy.dialects.fields import GEMINI as KNOWN_FIELDS
from proxy.dialects.fields import GEMINI_COUNT_TOKENS, GEMINI_GENERATION, GEMINI_TOOL_CONFIG, refuse_unknown_google
from proxy.dialects.gemini_objects import error_body
from proxy.dialects.gemini_stream import GeminiStream
from proxy.errors import InvalidRequest
from proxy.schemas import only_fields, validate

Number = StrictInt | StrictFloat
# Parts whose content reaches the engine's prompt; `thought` and `thoughtSignature` ride on them.
PARTS = ("text", "inlineData", "fileData", "functionCall", "functionResponse")
PART_FIELDS = frozenset({*PARTS, "thought", "thoughtSignature", "videoMetadata", "partMetadata", "mediaResolution"})
# Set (truthy), each would be ignored by the engine and the agent would not get what it asked for.
UNSERVED = {"responseLogprobs": "log-probabilities in the answer", "logprobs": "log-probabilities in the answer",
            "speechConfig": "audio output", "imageConfig": "image output", "audioTimestamp": "audio input",
            "enableAffectiveDialog": "affective dialog", "audioTranscriptionConfig": "audio transcription"}
MODES = {"AUTO": "auto", "VALIDATED": "auto", "MODE_UNSPECIFIED": "auto", "ANY": "required", "NONE": "none"}


class GenerationConfig(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra=only_fields(GEMINI_GENERATION))

    temperature: Number | None = Field(None, ge=0)
    topP: Number | None = Field(None, ge=0, le=1)
    topK: Number | None = Field(None, ge=1)
    maxOutputTokens: StrictInt | None = Field(None, ge=1)
    candidateCount: StrictInt | None = Field(None, ge=1)
    stopSequences: list[StrictStr] | None = None
    seed: StrictInt | None = None
    presencePenalty: Number | None = None
    frequencyPenalty: Number | None = None
    responseMimeType: StrictStr | None = None
    responseSchema: dict[str, Any] | None = None
    responseJsonSchema: dict[str, Any] | None = None
    responseModalities: list[StrictStr] | None = None
    thinkingConfig: dict[str, Any] | None = None


class GenerateContentRequest(BaseModel):
    """What the proxy checks; the other fields the API knows (proxy/dialects/fields.py) are the agent's own and
    are recorded as sent, and any other is refused (400 naming it)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=only_fields(KNOWN_FIELDS))

    model: StrictStr | None = Field(None, description="The path's model (`models/{model}:…`) is the call's; "
                                                      "one here is overwritten with it.")
    contents: list[dict[str, Any]] = Field(min_length=1)
    systemInstruction: dict[str, Any] | StrictStr | None = None
    tools: list[dict[str, Any]] | None = None
    toolConfig: dict[str, Any] | None = None
    generationConfig: GenerationConfig | None = None
    safetySettings: list[dict[str, Any]] | None = None
    cachedContent: StrictStr | None = None


class CountTokensRequest(BaseModel):
    """countTokens' body: the contents alone, or a whole generateContent request."""

    model_config = ConfigDict(extra="allow", json_schema_extra=only_fields(GEMINI_COUNT_TOKENS))

    contents: list[dict[str, Any]] | None = None
    generateContentRequest: dict[str, Any] | None = None


def check_contents(body: dict[str, Any]) -> None:
    """Every turn readable, every part one the prompt holds (anything else would leave the prompt unseen)."""
    for index, content in enumerate(body["contents"]):
        where = f"contents[{index}]"
        if content.get("role", "user") not in ("user", "model", "function"):
            raise InvalidRequest(f"{where}.role: expected user or model", param=f"{where}.role")
        parts = content.get("parts")
        if not isinstance(parts, list) or not parts:
            raise InvalidRequest(f"{where}.parts: must not be empty", param=f"{where}.parts")
        for position, part in enumerate(parts):
            at = f"{where}.parts[{position}]"
            if not isinstance(part, dict):
                raise InvalidRequest(f"{at}: expected a Part object", param=at)
            refuse_unknown_google(part, PART_FIELDS, at)
            kinds = [kind for kind in PARTS if kind in part]
            if len(kinds) != 1:
                raise InvalidRequest(f"{at}: a part holds exactly one of {', '.join(PARTS)}"
                                     + (" (executableCode and codeExecutionResult are not available on this "
                                        "engine)" if not kinds else ""), param=at)
            kind = kinds[0]
            value = part[kind]
            if kind == "text" and not isinstance(value, str):
                raise InvalidRequest(f"{at}.text: expected a string", param=f"{at}.text")
            if kind != "text" and not isinstance(value, dict):
                raise InvalidRequest(f"{at}.{kind}: expected an object", param=f"{at}.{kind}")
            if kind in ("inlineData", "fileData") and not str(value.get("mimeType", "")).startswith("image/"):
                raise InvalidRequest(f"{at}.{kind}.mimeType: only images reach this engine's prompt",
                                     param=f"{at}.{kind}.mimeType")
            if kind == "functionCall" and content.get("role") != "model":
                raise InvalidRequest(f"{at}.functionCall: only a model turn calls functions", param=at)
            if kind in ("functionCall", "functionResponse") and not isinstance(value.get("name"), str):
                raise InvalidRequest(f"{at}.{kind}.name: required", param=f"{at}.{kind}.name")
            if kind == "functionCall" and not isinstance(value.get("args", {}), dict):
                raise InvalidRequest(f"{at}.functionCall.args: expected an object", param=f"{at}.functionCall.args")
    system = body.get("systemInstruction")
    if isinstance(system, dict) and not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                            for p in system.get("parts") or ()):
        raise InvalidRequest("systemInstruction.parts: only text parts", param="systemInstruction.parts")


def check_tools(body: dict[str, Any]) -> None:
    for index, tool in enumerate(body.get("tools") or ()):
        other = sorted(set(tool) - {"functionDeclarations"})
        if other:
            raise InvalidRequest(f"tools[{index}].{other[0][:64]}: this engine runs no server-side tools; declare "
                                 "functions (functionDeclarations) and run them in the agent",
                                 param=f"tools[{index}].{other[0][:64]}")
        for position, declaration in enumerate(tool.get("functionDeclarations") or ()):
            if not isinstance(declaration, dict) or not isinstance(declaration.get("name"), str):
                raise InvalidRequest(f"tools[{index}].functionDeclarations[{position}].name: required",
                                     param=f"tools[{index}].functionDeclarations[{position}].name")
    config = body.get("toolConfig")
    if config is not None:
        refuse_unknown_google(config, GEMINI_TOOL_CONFIG, "toolConfig")
        calling = config.get("functionCallingConfig") or {}
        if not isinstance(calling, dict) or calling.get("mode", "AUTO") not in MODES:
            raise InvalidRequest("toolConfig.functionCallingConfig.mode: one of AUTO, ANY, NONE, VALIDATED",
                                 param="toolConfig.functionCallingConfig.mode")
        names = calling.get("allowedFunctionNames")
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise InvalidRequest("toolConfig.functionCallingConfig.allowedFunctionNames: a list of names",
                                 param="toolConfig.functionCallingConfig.allowedFunctionNames")


def check_generation(config: dict[str, Any]) -> None:
    refuse_unknown_google(config, GEMINI_GENERATION, "generationConfig")
    for name, what in UNSERVED.items():
        if config.get(name):
            raise InvalidRequest(f"generationConfig.{name}: {what} is not available on this engine",
                                 param=f"generationConfig.{name}")
    if any(modality.upper() != "TEXT" for modality in config.get("responseModalities") or ()):
        raise InvalidRequest("generationConfig.responseModalities: this engine answers TEXT only",
                             param="generationConfig.responseModalities")
    mime = config.get("responseMimeType")
    if mime not in (None, "text/plain", "application/json"):
        raise InvalidRequest("generationConfig.responseMimeType: text/plain or application/json",
                             param="generationConfig.responseMimeType")
    top_k = config.get("topK")
    if top_k is not None and top_k != int(top_k):
        raise InvalidRequest("generationConfig.topK: a whole number", param="generationConfig.topK")


class GeminiDialect:
    translates = True
    route = "gemini"
    engine_route = CHAT
    engine_path = "/v1/chat/completions"

    def __init__(self, path: str, stream: bool) -> None:
        self.path = path
        self.stream = stream  # the route streams (streamGenerateContent), whatever the body says

    def validate(self, body: dict[str, Any], allowed: frozenset[str] = frozenset()) -> None:
        refuse_unknown_google(body, KNOWN_FIELDS | allowed)
        validate(GenerateContentRequest, body)
        for name in ("cachedContent", "continuationToken"):
            if body.get(name):
                raise InvalidRequest(f"{name}: this engine keeps no contents between calls; send the contents",
                                     param=name)
        check_contents(body)
        check_tools(body)
        check_generation(body.get("generationConfig") or {})

    # -- request ---------------------------------------------------------------------------------------
    def to_chat(self, body: dict[str, Any], history: Sequence[dict[str, Any]]) -> dict[str, Any]:
        config = body.get("generationConfig") or {}
        chat: dict[str, Any] = {"model": body["model"], "messages": chat_messages(body)}
        for name, chat_name in (("temperature", "temperature"), ("topP", "top_p"), ("maxOutputTokens", "max_tokens"),
                                ("candidateCount", "n"), ("seed", "seed"), ("presencePenalty", "presence_penalty"),
                                ("frequencyPenalty", "frequency_penalty")):
            if config.get(name) is not None:
                chat[chat_name] = config[name]
        if config.get("topK") is not None:
            chat["top_k"] = int(config["topK"])
        if config.get("stopSequences"):
            chat["stop"] = config["stopSequences"]
        tools = chat_tools(body)
        if tools:
            chat["tools"], chat["tool_choice"] = _tool_choice(body.get("toolConfig") or {}, tools)
        response_format = _response_format(config)
        if response_format is not None:
            chat["response_format"] = response_format
        if self.stream:
            chat["stream"] = True
        return chat

    # -- response --------------------------------------------------------------------------------------
    def translator(self, body: dict[str, Any], call_id: str, created: int, additions: Additions) -> GeminiStream:
        return GeminiStream(body, call_id)

    def engine_error(self, status: int, raw: bytes) -> bytes:
        message, _ = engine_error_message(raw)
        return orjson.dumps(error_body(status, message))


def _tool_choice(config: dict[str, Any], tools: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Any]:
    """The functions offered and chat's tool choice for `functionCallingConfig`: ANY with one allowed name is
    that function; with several, only they are offered (chat's `required` cannot name a subset)."""
    calling = config.get("functionCallingConfig") or {}
    choice = MODES[calling.get("mode", "AUTO")]
    names = calling.get("allowedFunctionNames")
    if choice == "required" and names:
        if len(names) == 1:
            return tools, {"type": "function", "function": {"name": names[0]}}
        tools = [tool for tool in tools if tool["function"]["name"] in names]
    return tools, choice


def _response_format(config: dict[str, Any]) -> dict[str, Any] | None:
    """JSON output as the chat route's `response_format`: a schema the answer must follow, or any JSON object."""
    if config.get("responseMimeType") != "application/json":
        return None
    schema = config.get("responseJsonSchema")
    if schema is None and config.get("responseSchema") is not None:
        schema = json_schema(config["responseSchema"])
    if schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "json_schema", "schema": schema}}


GEMINI = GeminiDialect("/v1beta/models/{model}:generateContent", stream=False)
GEMINI_STREAM = GeminiDialect("/v1beta/models/{model}:streamGenerateContent", stream=True)

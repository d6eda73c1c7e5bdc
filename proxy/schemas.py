"""Request models of the proxy's own routes and what the API routes' models share (the API routes' own are in
proxy/dialects/: they check only what the proxy relies on; the other fields a route takes pass through as the
agent sent them, and the proxy forwards the checked JSON object, never a re-serialized model)."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictStr,
                      ValidationError, field_validator, model_validator)

from core.checks import reward_problem
from core.ids import ID_LIMITS as LIMITS, is_valid_id, task_id_problem
from proxy.errors import InvalidRequest, ProxyError, Unprocessable
from proxy.strict_json import read_json_object


def only_fields(fields: frozenset[str]):
    """A request model's `json_schema_extra`: its route's other fields (proxy/dialects/fields.py) as properties
    of any value, and no field besides, as the route answers (400 naming the field)."""
    def close(schema: dict[str, Any]) -> None:
        properties = schema.setdefault("properties", {})
        for name in sorted(fields - properties.keys()):
            properties[name] = {}
        schema["additionalProperties"] = False
    return close


class TraceExport(BaseModel):
    """OTLP's ExportTraceServiceRequest in its JSON encoding (opentelemetry-proto's trace_service.proto; ids in
    hex), read by `google.protobuf.json_format`, not by this model: it only documents the body."""

    model_config = ConfigDict(extra="allow")

    resourceSpans: list[dict[str, Any]] = Field(default_factory=list)


class EngineRequest(BaseModel):
    """The body of a relayed engine route (proxy/edge/engine_routes.py): a JSON object read by the request boundary's
    rules (proxy/boundary.py), with only the route's fields (`FIELDS` there; docs/contract.md lists them) and a
    `model` the key may call; their values are the engine's to read and to refuse."""

    model_config = ConfigDict(extra="allow")


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


class _Stored(BaseModel):
    """A body whose fields are stored as they are: Postgres text and JSONB cannot hold NUL characters, so
    they are refused here (422) rather than by the database (500)."""

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        if _has_nul(data):
            raise ValueError("text may not contain NUL (\\u0000) characters")
        return data


def _id_rules(what: str):
    """The rules of the X-Task-Id and X-Agent-Name headers (proxy/context.py): what one call may name, a rollout
    may too (and the store's columns hold it)."""
    def check(value: str) -> str:
        if what == "task" and (problem := task_id_problem(value)) is not None:
            raise ValueError(problem)
        if not is_valid_id(value, what):
            raise ValueError(f"must be 1-{LIMITS[what]} characters" + (
                " without control characters" if what == "task" else " of letters, digits and ._:@- (not . or ..)"))
        return value
    return AfterValidator(check)


TaskId = Annotated[StrictStr, Field(max_length=LIMITS["task"]), _id_rules("task")]
AgentName = Annotated[StrictStr, Field(max_length=LIMITS["agent"], pattern=r"^[A-Za-z0-9._:@\-]+$"),
                      _id_rules("agent")]


class RolloutCreate(_Stored):
    model_config = ConfigDict(extra="forbid")

    task_id: TaskId | None = None
    agent: AgentName | None = None
    metadata: dict[str, Any] | None = None
    eval: StrictBool = Field(False, description="Evaluation traffic: served like any other rollout, never "
                                                "trained on; its final reward, which only its grader gives, is "
                                                "reported per policy version. Needs the operator key, an admin "
                                                "key of the project or a key made for evaluation.")
    reward_source: Literal["agent", "grader", "runner", "judge"] | None = Field(
        None, description="Who gives the final reward: the agent (the default; any credential of the rollout), "
                          "its grader (runner is the same: whoever created it, with the grader token the answer "
                          "holds) or the trainer's judge. A reward anyone else posts is kept as a claim.")


class RewardPost(_Stored):
    model_config = ConfigDict(extra="forbid")

    rollout_id: StrictStr = Field(min_length=1)
    reward: StrictFloat  # an integer is taken as a float; one type, so an error names `reward`, not `reward.float`
    call_id: StrictStr | None = None
    task_id: TaskId | None = None
    metadata: dict[str, Any] | None = None

    @field_validator("reward")
    @classmethod
    def _finite(cls, value: float) -> float:
        if problem := reward_problem(value):
            raise ValueError(problem)
        return float(value)


class RolloutClose(BaseModel):
    """`POST /rollouts/{rollout_id}/close` takes no fields: an empty body or `{}` (any field is refused)."""

    model_config = ConfigDict(extra="forbid")


def parse_json_object(raw: bytes, error: type[ProxyError] = InvalidRequest) -> dict[str, Any]:
    """A request body that must be a JSON object, read by the one set of rules every body is read by
    (proxy/strict_json.py): so every string in it can be written out again, and no reader downstream can read it
    another way."""
    return read_json_object(raw, error)


def validate(model: type[BaseModel], body: dict[str, Any], error: type[ProxyError] = InvalidRequest) -> BaseModel:
    """Validate `body`, raising the first problem as an OpenAI-shaped error that names the parameter."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise error(f"{param}: {first['msg']}" if param else first["msg"], param=param) from None


__all__ = ["EngineRequest", "RolloutCreate", "RewardPost",
           "TraceExport", "parse_json_object", "validate", "Unprocessable"]

"""Response bodies of the proxy's own routes, as typed models: the handlers answer with them and the OpenAPI
document's schemas are generated from them (proxy/api/openapi.py), so what is sent and what is documented are one
definition. Request bodies are in proxy/schemas.py and the dialect modules.

Bodies the proxy builds itself forbid extra fields (a field added to an answer must be added here); bodies it
passes on from the engine or renders in another API's shape (Response, Message) say only what the proxy
guarantees and allow the rest."""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from proxy.errors import json_response


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    omit_unset: ClassVar[bool] = False

    def reply(self, status: int = 200, headers: dict[str, str] | None = None):
        """The aiohttp answer: this body as JSON. Fields left unset that default to None are left out only
        where the model says so (`omit_unset`); every other field is sent, null included."""
        omit = self.omit_unset
        return json_response(self.model_dump(mode="json", exclude_unset=omit), status=status, headers=headers)


# -- errors ---------------------------------------------------------------------------------------------------
class ErrorDetail(Body):
    message: str
    type: str
    param: str | None
    code: str | int | None


class Error(Body):
    """OpenAI's error shape, on every route except the Anthropic ones (also as the last event of a stream)."""

    error: ErrorDetail


class AnthropicErrorDetail(Body):
    type: str
    message: str


class AnthropicError(Body):
    """Anthropic's error shape, on /v1/messages and /v1/messages/count_tokens."""

    type: Literal["error"]
    error: AnthropicErrorDetail


# -- rollouts and rewards -------------------------------------------------------------------------------------
class RolloutCreated(Body):
    rollout_id: str
    base_url: str = Field(description="The OpenAI-compatible base URL (ends in /v1) an agent is given: every "
                                      "call through it is recorded into this rollout.")
    token: str = Field(description="The rollout's own token, shown once: what its agent is given as its key. It "
                                   "works under /rollouts/{rollout_id}/… and for this rollout's reward and "
                                   "events alone (docs/security.md).")
    reward_source: Literal["agent", "grader", "judge"] = Field(
        description="Who gives the final reward: the agent (any credential of the rollout), its grader (the "
                    "grader token, an admin or evaluation key of its project, the operator key) or the trainer's "
                    "judge; a reward anyone else posts is kept as a claim.")
    grader_token: str | None = Field(None, description="With a reward source other than the agent: the grader's "
                                                       "token, shown once, for whoever grades it, never its agent.")


class RewardResult(Body):
    omit_unset: ClassVar[bool] = True  # call_id only for a reward given to one call

    rollout_id: str
    reward: float
    call_id: str | None = Field(None, description="The call the reward was given to (per-call rewards only).")
    claim: bool | None = Field(None, description="True when the rollout's reward is given by its grader and this "
                                                "one was kept as a claim beside it: it neither closes the rollout "
                                                "nor is trained on.")


class RolloutClosed(Body):
    rollout_id: str
    status: Literal["open", "finished"] = Field(description="The rollout's status after the request.")
    closed: bool = Field(description="True when this request closed it (false: it was closed already, or "
                                     "`claim`).")
    claim: bool = Field(False, description="True when the rollout's grader or judge gives its end, not this "
                                           "caller: nothing changed, and the close is counted as a claim.")


class ChoiceRecord(Body):
    index: int
    token_ids: list[int] | None
    logprobs: list[float | None] | None  # null where the engine's logprob was not a finite number
    finish_reason: str | None


class CallRecord(Body):
    """One recorded call: what the agent sent and got, with the engine's exact token ids and logprobs."""

    call_id: str
    seq: int | None
    agent: str | None
    model: str | None
    policy: int | None = Field(description="The policy version that answered (0: the base model).")
    policy_name: str | None = Field(None, description="The named policy that answered (docs/policies.md); null "
                                                      "for a call to a model outside the policies.")
    status: str
    http_status: int | None
    stream: bool
    route: str
    prompt_token_ids: list[int] | list[list[int]] | None = Field(
        description="The engine's prompt ids; one list per prompt for a batch of legacy completions prompts.")
    completion_token_ids: list[int] | None
    completion_logprobs: list[float | None] | None
    finish_reason: str | None
    choices: list[ChoiceRecord]
    prefix_kind: str | None
    prefix_parent_id: str | None
    latency_ms: float | None
    ttft_ms: float | None
    sampling: str | None = Field(None, description="The first request field that made the sampled distribution "
                                                   "differ from the recorded (raw) log-probs, e.g. "
                                                   "\"temperature=0.7\"; the trainer skips such a call "
                                                   "(sampling_altered). Null: the log-probs are the sampling "
                                                   "probabilities.")
    sampling_override: dict[str, Any] | None = Field(
        None, description="What `rlproxy serve --rollout-sampling` changed in the agent's request before it went to "
                          "the engine: {\"rule\", \"asked\": the agent's values (null: not sent), \"sent\": the "
                          "engine's}. `request` is the agent's own; `sampling` what the engine sampled with. Null: "
                          "nothing was changed.")
    request: dict[str, Any] | None
    response: dict[str, Any] | None
    error: str | None


class RewardRecord(Body):
    call_id: str | None
    kind: str = Field(description='final, call, air, or claim (posted by someone who does not give the rollout\'s '
                                  'rewards; `reason` says who: agent, admin…)')
    claim: bool = Field(False, description="Whether it is a claim (kind claim): never trained on.")
    value: float
    reason: str | None
    metadata: dict[str, Any] | None
    created_at: str | None


class PolicyCalls(Body):
    policy: int | None = Field(description="The version that answered (0: the base model; null: none recorded).")
    calls: int
    first_seq: int | None
    last_seq: int | None


class StatusCalls(Body):
    status: str
    http_status: int | None
    calls: int


class RolloutSummary(Body):
    """What the rollout's calls came to (`?calls=false`), read without reading them."""

    call_count: int
    policies: list[PolicyCalls] = Field(description="The versions that answered, in the order each first did.")
    statuses: list[StatusCalls]


class Rollout(Body):
    rollout_id: str
    task_id: str | None
    agent: str | None
    status: Literal["open", "finished", "expired"] = Field(
        description="open: calls may still come; finished: its final reward arrived; expired: none arrived "
                    "within the trainer's reward TTL (never trained on, takes no more rewards).")
    reward: float | None
    metadata: dict[str, Any] | None
    created_at: str | None
    finished_at: str | None
    trained: bool
    eval: bool
    reward_source: str | None = Field(None, description="Who gives its final reward: agent, grader or judge.")
    rewarded_by: str | None = Field(None, description="Who gave it: agent, grader, admin, eval_key, operator or "
                                                      "judge (null: not rewarded, or before migration 0015).")
    policy: int | None
    calls: list[CallRecord]
    rewards: list[RewardRecord]
    next: int | None = Field(None, description="The `after` of the following page of calls (`?after=`), or null "
                                               "when this page holds the last call.")
    summary: RolloutSummary | None = Field(None, description="Only with `?calls=false`: then `calls` is empty and "
                                                             "`rewards` holds the rollout's own.")


class ExportPartialSuccess(Body):
    rejectedSpans: str = Field(pattern=r"^[0-9]+$", description="How many spans were refused (an int64, written "
                                                                 "as protobuf's JSON mapping writes one).")
    errorMessage: str = Field(description="Why, span by span.")


class TraceExportResult(Body):
    """OTLP's ExportTraceServiceResponse: empty when every span was taken (or ignored: it named no rollout, or
    carried nothing to score)."""

    omit_unset: ClassVar[bool] = True

    partialSuccess: ExportPartialSuccess | None = Field(None, description="Present when some spans were refused.")


# -- policies -------------------------------------------------------------------------------------------------
class EvaluationTraffic(Body):
    """Final rewards of the finished evaluation rollouts this version served. ci95: Wilson's interval when every
    reward is 0 or 1, else Student's t interval on the mean (null for a single non-binary reward)."""

    n: int = Field(ge=0)
    mean: float | None
    ci95: tuple[float, float] | None
    interval: Literal["wilson", "t"] | None


class ServedAgreement(Body):
    """The engines against the trainer on the tokens a version sampled (trainer/agreement.py)."""

    version: int
    kl: float = Field(description="KL(engine || trainer) per token (k3 estimate).")
    mean_abs: float = Field(description="Mean absolute difference of the log-probs per token.")
    tokens: int
    bound: float = Field(description="agreement_alarm_kl of the trainer that measured it (0: no alarm).")
    alarm: bool = Field(description="Whether kl passed the bound: the engines do not serve the trained adapter.")


class Policy(Body):
    version: int
    policy: str = Field(description="The named policy the version belongs to.")
    name: str | None = Field(description="The engine's adapter name; null for the base model (version 0).")
    status: Literal["candidate", "active", "retired", "failed", "canary"]
    parent_version: int | None
    path: str | None
    metrics: dict[str, Any] | None
    evaluation: dict[str, Any] | None
    evaluation_traffic: EvaluationTraffic
    agreement: ServedAgreement | None = Field(
        None, description="How well the engines' log-probs of the calls this version served agreed with the "
                          "trainer's of it, measured by the step that trained from it; null until then (and for "
                          "the base model: see the step records).")
    weights_kept: bool = Field(
        True, description="Whether the version's adapter folder is still there (the trainer removes those no "
                          "longer needed, docs/retention.md); false: it cannot be activated (409).")
    created_at: str | None
    activated_at: str | None


class PolicyYield(Body):
    """What the trainer did with a policy's calls over its last steps (store/step_history.py recent_yield)."""

    steps: int = Field(description="Steps counted (the policy's last yield_window steps, fewer at first), those "
                                   "that trained nothing of it included.")
    calls_seen: int = Field(description="Calls the policy answered in those steps' rollouts.")
    calls_trained: int
    calls_skipped: dict[str, int] = Field(description="Calls not trained, by reason (docs/learning.md).")
    share_trained: float | None = Field(description="calls_trained / calls_seen; null before any call.")


class PolicyList(Body):
    data: list[Policy]
    policy: str = Field(description="The named policy listed.")
    active: int = Field(description="The version of that policy that serves (0: the base model).")
    policies: dict[str, int] = Field(description="Every named policy the routing rules or the store know, with "
                                                 "the version it serves.")
    yields: dict[str, PolicyYield] | None = Field(
        None, description="Per named policy in `policies`, what the trainer did with its calls over its last "
                          "steps; null for a project's key (a step's batch holds every project's rollouts).")


class Activated(Body):
    version: int
    policy: str
    status: Literal["active"]


# -- operations -----------------------------------------------------------------------------------------------
class Health(Body):
    status: Literal["ok"]


class SpoolState(Body):
    pending: int = Field(description="Calls in the spool waiting to be written to the database.")
    spooling: bool = Field(description="New calls are going to the spool (the database is not taking them).")
    durability: Literal["spool", "sync", "batch"]
    path: str
    writable: bool = Field(True, description="The spool takes calls now: an append succeeded last (or failed over "
                                             "30 s ago), its volume has 1 MiB free, and its directory takes a file.")
    problem: str | None = Field(None, description="Why the spool cannot take calls, when it cannot.")


class Ready(Body):
    """The status for every caller; the details (engine URLs, the spool's path, …) only with an admin key, or
    when auth is off."""

    omit_unset: ClassVar[bool] = True

    status: Literal["ready", "unavailable"]
    database: bool | None = None
    writer: bool | None = Field(None, description="The capture writer is running: false while it starts again "
                                                  "after a failure (then the status is unavailable).")
    engines: dict[str, bool] | None = None
    spooled_calls: int | None = None
    policy: int | None = Field(None, description="The policy version serving now.")
    spool: SpoolState | None = None


class TokenCount(Body):
    input_tokens: int


# -- bodies in another API's shape, or the engine's own ---------------------------------------------------------
class EngineObject(BaseModel):
    """The engine's own response, passed through."""

    model_config = ConfigDict(extra="allow")


class OpenAPIDocument(BaseModel):
    """An OpenAPI 3.1 document (this one)."""

    model_config = ConfigDict(extra="allow")

    openapi: str
    paths: dict[str, Any]


class Response(BaseModel):
    """An OpenAI Response (id `resp_<call id>`)."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["response"]
    status: str
    output: list[Any]
    model: str


class Message(BaseModel):
    """An Anthropic Message (id `msg_<call id>`)."""

    model_config = ConfigDict(extra="allow")

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    content: list[Any]
    stop_reason: str | None
    usage: dict[str, Any]



class GoogleErrorDetail(Body):
    omit_unset: ClassVar[bool] = True

    code: int
    message: str
    status: str = Field(description="The google.rpc.Code name: INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE, …")
    details: list[dict[str, Any]] | None = Field(None, description="An ErrorInfo whose `reason` is the proxy's "
                                                                    "error code, when it has one.")


class GoogleError(Body):
    """Google's error shape, on the Gemini API's routes (/v1beta/models/…)."""

    error: GoogleErrorDetail


class GenerateContentResponse(BaseModel):
    """A Gemini API GenerateContentResponse (`responseId` is the call's id)."""

    model_config = ConfigDict(extra="allow")

    candidates: list[dict[str, Any]]
    usageMetadata: dict[str, int]
    modelVersion: str
    responseId: str


class GeminiTokenCount(Body):
    totalTokens: int


class GeminiModels(BaseModel):
    """The engine's models as the Gemini API lists them (`name`: `models/<id>`)."""

    model_config = ConfigDict(extra="allow")

    models: list[dict[str, Any]]

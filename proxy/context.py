"""Who a call belongs to: rollout, agent and task, from the URL path (which wins) or the headers."""
from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from core.ids import ID_LIMITS, is_valid_id, task_id_problem
from proxy.errors import InvalidRequest

LIMITS = ID_LIMITS
EVAL_HEADER = "X-Rlproxy-Eval"
_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


@dataclass(slots=True, frozen=True)
class CallContext:
    rollout_id: str | None
    agent: str | None
    task_id: str | None
    project: str | None = None
    eval: bool = False  # `X-Rlproxy-Eval: 1`: the call's rollout is evaluation traffic, never trained on


def _clean(value: str | None, what: str) -> str | None:
    if value is None or value == "":
        return None
    if what == "task" and (problem := task_id_problem(value)) is not None:
        raise InvalidRequest(f"X-Task-Id: {problem}", param=what, code="invalid_id")
    if not is_valid_id(value, what):
        raise InvalidRequest(f"{what} id must be 1-{LIMITS[what]} characters of letters, digits and ._:@- "
                             "(not . or ..)", param=what, code="invalid_id")
    return value


def one_header(request: web.Request, name: str) -> str | None:
    """The value of a header that says one thing; 400 when it is sent several times with different values (which
    one a gateway in front read, and which this proxy would, could differ)."""
    values = request.headers.getall(name, ())
    if len(set(values)) > 1:
        raise InvalidRequest(f"{name} is sent {len(values)} times with different values: send it once",
                             param=name, code="repeated_header")
    return values[0] if values else None


def eval_flag(request: web.Request) -> bool:
    """The `X-Rlproxy-Eval` header: 1/true/yes/on or 0/false/no/off (any case); absent or empty is false."""
    value = (one_header(request, EVAL_HEADER) or "").strip().lower()
    if value == "":
        return False
    if value not in _FLAGS:
        raise InvalidRequest(f"{EVAL_HEADER} must be 1 or 0 (or true/false, yes/no, on/off)", param=EVAL_HEADER,
                             code="invalid_header")
    return _FLAGS[value]


def call_context(request: web.Request) -> CallContext:
    match = request.match_info
    return CallContext(
        rollout_id=_clean(match.get("rollout_id") or one_header(request, "X-Rollout-Id"), "rollout"),
        agent=_clean(match.get("agent") or one_header(request, "X-Agent-Name"), "agent"),
        task_id=_clean(one_header(request, "X-Task-Id"), "task"),
        project=request.get("project"),
        eval=eval_flag(request),
    )

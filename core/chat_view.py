"""A recorded call in chat form, whatever wire format it came through: what automatic rewards
(proxy/recording/air.py), the OpenTelemetry reward ingest (proxy/otlp/export.py) and the judge (rewards/judge.py) read, so none of them cares which
API an agent speaks. Chat and completions calls are already in that form; Responses, Messages and Gemini calls are
read with the same translation that built the engine's prompt (core/responses_chat.py, core/messages_chat.py,
core/gemini_chat.py)."""
from __future__ import annotations

from typing import Any

from core.gemini_chat import chat_view as gemini_view
from core.messages_chat import chat_view as messages_view
from core.responses_chat import chat_view as responses_view

VIEWS = {"responses": responses_view, "messages": messages_view, "gemini": gemini_view}


def chat_view(route: str | None, request: dict[str, Any] | None, response: dict[str, Any] | None
              ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A recorded call's request (`messages`, `tools`) and response (`choices[0].message`) in chat form; a chat
    or completions call as it is. None for a part that cannot be read."""
    view = VIEWS.get(route or "")
    if view is None:
        return request, response
    return view(request, response)

"""The teacher's view of a transition: the student's prompt with the teacher context inserted, re-rendered by the
policy's chat template, followed by the student's exact completion ids (never re-tokenized). Pure: no I/O.

    prompt = teacher_prompt(request, recorded_prompt_ids, tokenizer, context, at="system")
    # -> ids, or a reason (str) why this call's prompt cannot be shown to the teacher with its context

The context is placed by editing the recorded chat messages (a copy: the stored request is never changed) and
rendering them as the engine did. That is only exact where the recorded prompt ids are what the template renders
from the recorded messages; where they are not (a client-side template, a format the trainer cannot render), the
call is not shown to the teacher and the reason is counted, rather than guessing where the context would go.
"""
from __future__ import annotations

import copy
import json
from typing import Any

UNRENDERED = "teacher_no_messages"  # the recorded request holds no chat messages (another wire format, redacted)
MISMATCH = "teacher_render_mismatch"  # the template's rendering of the recorded messages is not the recorded prompt
ROLES = ("system", "user", "assistant")  # of a context given as chat turns


def context_turns(context: str) -> list[dict[str, Any]] | None:
    """The context as chat turns, when it is a JSON array of {"role", "content"} messages (worked examples as a
    conversation); None for plain text."""
    if not context.lstrip().startswith("["):
        return None
    try:
        turns = json.loads(context)
    except ValueError:
        return None
    if isinstance(turns, list) and turns and all(
            isinstance(t, dict) and t.get("role") in ROLES and isinstance(t.get("content"), str) for t in turns):
        return turns
    return None


def with_context(messages: list[dict[str, Any]], context: str, at: str) -> list[dict[str, Any]]:
    """A copy of `messages` with `context` as a system message (appended to an existing first system message's
    text), or as a user message before the last user message (`at="before_last_user"`; first if there is none).
    A context of chat turns (`context_turns`) is inserted as those turns: after the leading system message, or
    before the last user message."""
    shown = copy.deepcopy(messages)
    users = [i for i, message in enumerate(shown) if message.get("role") == "user"]
    if (turns := context_turns(context)) is not None:
        lead = 1 if shown and shown[0].get("role") in ("system", "developer") else 0
        place = lead if at == "system" else (users[-1] if users else lead)
        return shown[:place] + copy.deepcopy(turns) + shown[place:]
    if at == "system":
        if shown and shown[0].get("role") in ("system", "developer"):
            first = shown[0]
            content = first.get("content")
            if isinstance(content, list):
                first["content"] = [*content, {"type": "text", "text": context}]
            else:
                first["content"] = f"{content or ''}\n\n{context}" if content else context
        else:
            shown.insert(0, {"role": "system", "content": context})
        return shown
    shown.insert(users[-1] if users else 0, {"role": "user", "content": context})
    return shown


def render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
    """The chat template's prompt ids for `messages`, with the generation prompt, as the engine renders them."""
    ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    return list(ids)


def teacher_prompt(request: dict | None, prompt_ids: list[int], tokenizer: Any, context: str | None,
                   at: str = "system") -> list[int] | str:
    """The ids the teacher is prompted with for a call recorded with `request` and prompted with `prompt_ids`:
    those ids themselves without a context, else the messages with the context, rendered (or a reason)."""
    if context is None:
        return list(prompt_ids)
    messages = (request or {}).get("messages")
    if not isinstance(messages, list) or not messages:
        return UNRENDERED
    tools = (request or {}).get("tools")
    if render(tokenizer, messages, tools) != list(prompt_ids):
        return MISMATCH
    return render(tokenizer, with_context(messages, context, at), tools)

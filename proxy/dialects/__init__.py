"""The wire formats agents speak, each a dialect over the one capture core in `proxy/serving.py`.

Every policy call goes to the engine as a Chat Completions request (legacy Completions as a Completions
request), whatever API the agent speaks, because that is the one route on which every engine returns the exact
prompt and completion token ids and the sampling logprobs, streamed chunk by chunk (vLLM 0.32's `/v1/messages`
returns no ids at all; its `/v1/responses` returns them only when asked with `enable_response_messages`, and keeps
no state for `previous_response_id` unless its response store is turned on). So each dialect is pure
translation, with no I/O (proxy/dialects/base.py `Dialect`):

    request   the agent's body  -> the engine's body (`to_chat`)
    response  the engine's answer -> the agent's format, whole or event by event (`translator`)
    errors    the proxy's errors and the engine's -> the agent's error shape

`chat` and `completions` are the engine's own formats: their translation relays the engine's bytes as they came
(proxy/dialects/chat.py). `responses` is the OpenAI Responses API, `messages` Anthropic's Messages API, `gemini`
Google's Gemini API (two dialects of one recorded route: whole and streamed, which its path says); each is
a dialect module, the module making its answer (`*_stream`), and the module building its answer's objects
(`*_objects`), imported in that one direction. What the conversation is in chat form lives on the ground floor
(core/responses_chat.py, core/messages_chat.py, core/gemini_chat.py), where automatic rewards and the judge read recorded calls with
it too (core/chat_view.py).
"""
from __future__ import annotations

from proxy.dialects.base import Dialect
from proxy.dialects.chat import CHAT_COMPLETIONS, TEXT_COMPLETIONS
from proxy.dialects.gemini import GEMINI, GEMINI_STREAM
from proxy.dialects.messages import MESSAGES
from proxy.dialects.responses import RESPONSES

# Each served by its own CompletionServing, under this name (a dialect's route, but Gemini's stream's).
DIALECTS: dict[str, Dialect] = {**{d.route: d for d in (CHAT_COMPLETIONS, TEXT_COMPLETIONS, RESPONSES, MESSAGES,
                                                        GEMINI)}, "gemini_stream": GEMINI_STREAM}

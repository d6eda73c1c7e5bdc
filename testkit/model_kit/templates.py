"""Chat templates with each family's behaviour, written for this project (none is copied from a model
repository): what matters to rlproxy is how each family turns a conversation into tokens, so these reproduce
the behaviours that change the token prefix one call shares with the next.

Qwen3 (ChatML with `<think>` and hermes-style tools):
* tools listed in the system turn as JSON lines inside `<tools></tools>`; a call is `<tool_call>` + JSON with
  `name` and `arguments` + `</tool_call>`, the arguments re-rendered with `tojson` (vLLM hands the template
  parsed arguments, so the re-rendered text need not be the text the model sampled);
* tool results folded into one `user` turn of `<tool_response>` blocks;
* an assistant turn's reasoning (`reasoning_content`, or text before `</think>` in its content) kept only for
  turns after the last real user message, stripped before it;
* the generation prompt `<|im_start|>assistant\n`, with an empty think block when `enable_thinking` is false;
  turns end with `<|im_end|>`.

Llama 3.x (header tokens, JSON tool calls):
* `<|begin_of_text|>` from the template; a system turn always, carrying a knowledge cut-off and today's date
  (`date_string`, else `strftime_now`, so the prompt changes with the calendar);
* tools described in the first user turn; a call is a bare JSON object with `name` and `parameters`, results
  come back in `ipython` turns; every turn ends with `<|eot_id|>`.

gpt-oss (harmony): vLLM renders gpt-oss chats with openai_harmony, never with the template, but its `/tokenize`
(and so the proxy's Messages token count) renders them with the template; this one writes what harmony writes for
the chats vLLM's chat route builds (vllm/entrypoints/openai/parser/harmony_utils.py), so the two agree:
* a system turn naming the model, the knowledge cut-off, today's date (`conversation_date`, else
  `strftime_now`), the reasoning effort (medium unless `reasoning_effort`) and the channels; the chat's system and
  developer messages become a developer turn's `# Instructions`, the tools a TypeScript-like `namespace functions`;
* an answer is `<|channel|>final`, reasoning `<|channel|>analysis`, kept only after the last final answer; a call
  is `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>` + its arguments + `<|call|>`, its
  result a `functions.NAME` turn to the assistant; the generation prompt is `<|start|>assistant`.
"""
from __future__ import annotations

QWEN3 = r"""
{%- set ns = namespace(last_query=-1) -%}
{%- for message in messages -%}
  {%- if message.role == 'user' and not (message.content is string and message.content.startswith('<tool_response>')) -%}
    {%- set ns.last_query = loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
{%- set has_system = messages and messages[0].role == 'system' -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if has_system %}{{ messages[0].content + '\n\n' }}{% endif -%}
  {{- '# Tools\n\nFunctions you may call, one JSON signature per line inside <tools></tools>:\n<tools>' -}}
  {%- for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor -%}
  {{- '\n</tools>\n\nTo call one, answer with a JSON object holding its name and arguments between '
      '<tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
      '</tool_call><|im_end|>\n' -}}
{%- elif has_system -%}
  {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if loop.first and message.role == 'system' -%}
  {%- elif message.role == 'user' or message.role == 'system' -%}
    {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
  {%- elif message.role == 'assistant' -%}
    {%- set content = message.content if message.content is string else '' -%}
    {%- set reasoning = message.reasoning_content if message.reasoning_content is string else '' -%}
    {%- if not reasoning and '</think>' in content -%}
      {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
      {%- set content = content.split('</think>')[-1] -%}
    {%- endif -%}
    {%- set reasoning = reasoning.strip('\n') -%}
    {%- set content = content.lstrip('\n') -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if loop.index0 > ns.last_query and reasoning -%}
      {{- '<think>\n' + reasoning + '\n</think>\n\n' -}}
    {%- endif -%}
    {{- content -}}
    {%- for call in message.tool_calls or [] -%}
      {%- set function = call.function if call.function is defined else call -%}
      {%- if content or not loop.first %}{{ '\n' }}{% endif -%}
      {{- '<tool_call>\n{"name": "' + function.name + '", "arguments": ' -}}
      {%- if function.arguments is string %}{{ function.arguments }}{% else %}{{ function.arguments | tojson }}{% endif -%}
      {{- '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif -%}
    {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\n' }}{% endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and not enable_thinking %}{{ '<think>\n\n</think>\n\n' }}{% endif -%}
{%- endif -%}
""".strip("\n")

LLAMA3 = r"""
{{- bos_token -}}
{%- if date_string is not defined -%}
  {%- set date_string = strftime_now('%d %b %Y') if strftime_now is defined else '26 Jul 2024' -%}
{%- endif -%}
{%- set has_system = messages and messages[0].role == 'system' -%}
{%- set rest = messages[1:] if has_system else messages -%}
<|start_header_id|>system<|end_header_id|>

{% if tools %}Environment: ipython
{% endif %}Cutting Knowledge Date: December 2023
Today Date: {{ date_string }}

{% if has_system %}{{ messages[0].content }}{% endif %}<|eot_id|>
{%- set ns = namespace(tools_told=false) -%}
{%- for message in rest -%}
  {%- if message.role == 'user' and tools and not ns.tools_told -%}
    {%- set ns.tools_told = true -%}
<|start_header_id|>user<|end_header_id|>

Answer with a function call when one of these functions fits: a JSON object {"name": the function's name, "parameters": an object of its argument names and values}, and nothing else.

{% for tool in tools %}{{ tool | tojson(indent=4) }}

{% endfor %}{{ message.content }}<|eot_id|>
  {%- elif message.role == 'assistant' and message.tool_calls -%}
    {%- for call in message.tool_calls -%}
      {%- set function = call.function if call.function is defined else call -%}
<|start_header_id|>assistant<|end_header_id|>

{"name": "{{ function.name }}", "parameters": {% if function.arguments is string %}{{ function.arguments }}{% else %}{{ function.arguments | tojson }}{% endif %}}<|eot_id|>
    {%- endfor -%}
  {%- elif message.role == 'tool' or message.role == 'ipython' -%}
<|start_header_id|>ipython<|end_header_id|>

{% if message.content is mapping or message.content is iterable and message.content is not string %}{{ message.content | tojson }}{% else %}{{ message.content }}{% endif %}<|eot_id|>
  {%- else -%}
<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content }}<|eot_id|>
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|start_header_id|>assistant<|end_header_id|>

{% endif -%}
""".strip("\n")

GPT_OSS = r"""
{%- set ns = namespace(last_final=-1, name='', instructions='') -%}
{%- for message in messages -%}
  {%- if message.role == 'assistant' and message.content and not message.tool_calls -%}
    {%- set ns.last_final = loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
{%- if conversation_date is not defined -%}
  {%- set conversation_date = strftime_now('%Y-%m-%d') if strftime_now is defined else '2025-08-05' -%}
{%- endif -%}
<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.
Knowledge cutoff: 2024-06
Current date: {{ conversation_date }}

Reasoning: {{ reasoning_effort or 'medium' }}

# Valid channels: analysis, commentary, final. Channel must be included for every message.
{{- "\nCalls to these tools must go to the commentary channel: 'functions'." if tools else '' -}}
<|end|>
{%- for message in messages if message.role in ('system', 'developer') -%}
  {%- set ns.instructions = ns.instructions + ('\n\n' if ns.instructions else '') + message.content -%}
{%- endfor -%}
{%- if ns.instructions or tools -%}
<|start|>developer<|message|>
  {%- if ns.instructions %}{{ '# Instructions\n\n' + ns.instructions + ('\n\n' if tools else '') }}{% endif -%}
  {%- if tools -%}
# Tools

## functions

namespace functions {

{% for tool in tools -%}
{%- set function = tool.function if tool.function is defined else tool -%}
{%- if function.description %}// {{ function.description }}
{% endif -%}
type {{ function.name }} = (_: {
{% for name, spec in (function.parameters.properties or {}).items() -%}
{%- if spec.description %}// {{ spec.description }}
{% endif -%}
{{ name }}{% if name not in (function.parameters.required or []) %}?{% endif %}: {% if spec.type in ('integer', 'number') %}number{% elif spec.type == 'array' %}any[]{% elif spec.type in ('string', 'boolean') %}{{ spec.type }}{% else %}any{% endif %},
{% endfor -%}
}) => any;

{% endfor -%}
} // namespace functions
  {%- endif -%}
<|end|>
{%- endif -%}
{%- for message in messages -%}
  {%- if message.role == 'user' -%}
<|start|>user<|message|>{{ message.content }}<|end|>
  {%- elif message.role == 'assistant' -%}
    {%- set reasoning = message.reasoning or message.reasoning_content or '' -%}
    {%- if message.tool_calls -%}
      {%- if message.content %}<|start|>assistant<|channel|>commentary<|message|>{{ message.content }}<|end|>{% endif -%}
      {%- if reasoning and loop.index0 > ns.last_final %}<|start|>assistant<|channel|>analysis<|message|>{{ reasoning }}<|end|>{% endif -%}
      {%- for call in message.tool_calls -%}
        {%- set function = call.function if call.function is defined else call -%}
<|start|>assistant to=functions.{{ function.name }}<|channel|>commentary json<|message|>
        {%- if function.arguments is string %}{{ function.arguments }}{% else %}{{ function.arguments | tojson }}{% endif -%}
<|call|>
      {%- endfor -%}
    {%- else -%}
      {%- if reasoning and loop.index0 > ns.last_final %}<|start|>assistant<|channel|>analysis<|message|>{{ reasoning }}<|end|>{% endif -%}
      {%- if message.content %}<|start|>assistant<|channel|>final<|message|>{{ message.content }}<|end|>{% endif -%}
    {%- endif -%}
  {%- elif message.role == 'tool' -%}
    {%- set ns.name = '' -%}
    {%- for earlier in messages if earlier.role == 'assistant' and earlier.tool_calls -%}
      {%- for call in earlier.tool_calls if call.id == message.tool_call_id -%}
        {%- set ns.name = call.function.name if call.function is defined else call.name -%}
      {%- endfor -%}
    {%- endfor -%}
<|start|>functions.{{ ns.name }}<|channel|>commentary to=assistant<|message|>{{ message.content }}<|end|>
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|start|>assistant{% endif -%}
""".strip("\n")

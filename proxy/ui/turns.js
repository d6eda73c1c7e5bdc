// One recorded call as a conversation: the prompt as the agent sent it, the answer as it saw it, the sampled tokens.
// A recorded request is whatever the agent sent, bodies the engine refused included (`tool_calls: 5`, `messages:
// [null]`), so nothing here may assume a shape: lists are checked with Array.isArray, non-objects are shown as
// their JSON, and a section that still fails to render shows its raw JSON instead of taking the page down.
import {el, fmt, isObject, listOf} from "./common.js";

const ROLES = new Set(["system", "developer", "user", "assistant", "tool", "function", "prompt"]);

function json(value) {
  try { return JSON.stringify(value, null, 1) ?? String(value); } catch (error) { return String(value); }
}

function textOf(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map(textOf).filter(Boolean).join("\n");
  if (typeof content === "object") {
    if (typeof content.text === "string") return content.text;
    if (typeof content.thinking === "string") return content.thinking;
    if (content.content !== undefined) return textOf(content.content);
    if (content.output !== undefined) return textOf(content.output);
  }
  return json(content);
}

const called = (name, args) => `${typeof name === "string" ? name : json(name)}(${typeof args === "string" ? args : json(args)})`;

// A turn: {role, kind ("text" | "tool call" | "tool result" | "reasoning"), text}.
function turnsOfMessage(role, message) {
  role = typeof role === "string" && role ? role : "?";
  if (!isObject(message)) return [{role, kind: "text", text: textOf(message)}];
  const out = [];
  const reasoning = message.reasoning_content || message.reasoning;
  if (reasoning) out.push({role, kind: "reasoning", text: textOf(reasoning)});
  const content = message.content;
  if (Array.isArray(content)) {
    for (const block of content) {
      if (!isObject(block)) { out.push({role, kind: "text", text: textOf(block)}); continue; }
      if (block.type === "tool_use") out.push({role, kind: "tool call", text: called(block.name, json(block.input))});
      else if (block.type === "tool_result") out.push({role: "tool", kind: "tool result", text: textOf(block.content)});
      else if (block.type === "thinking" || block.type === "reasoning") out.push({role, kind: "reasoning", text: textOf(block)});
      else out.push({role, kind: "text", text: textOf(block)});
    }
  } else if (content !== null && content !== undefined && content !== "") {
    out.push({role, kind: role === "tool" ? "tool result" : "text", text: textOf(content)});
  }
  const calls = message.tool_calls;
  if (calls !== undefined && calls !== null && !Array.isArray(calls)) {
    out.push({role, kind: "tool call", text: json(calls)});  // not a list: shown as sent
  }
  for (const call of listOf(calls)) {
    const f = isObject(call) && isObject(call.function) ? call.function : null;
    out.push({role, kind: "tool call", text: f ? called(f.name, f.arguments) : json(call)});
  }
  return out;
}

function turnsOfItems(items, defaultRole) {  // Responses' input and output items
  const out = [];
  for (const item of listOf(items)) {
    if (typeof item === "string") out.push({role: defaultRole, kind: "text", text: item});
    else if (!isObject(item)) out.push({role: defaultRole, kind: "text", text: json(item)});
    else if (item.type === "function_call") out.push({role: "assistant", kind: "tool call", text: called(item.name, item.arguments)});
    else if (item.type === "function_call_output") out.push({role: "tool", kind: "tool result", text: textOf(item.output)});
    else if (item.type === "reasoning") out.push({role: "assistant", kind: "reasoning", text: textOf(item.summary || item.content)});
    else out.push(...turnsOfMessage(item.role || defaultRole, item));
  }
  return out;
}

function turnsOfContent(content) {  // a Gemini API Content: a role ("model" is the assistant) and its parts
  if (!isObject(content)) return [{role: "?", kind: "text", text: textOf(content)}];
  const role = content.role === "model" ? "assistant" : typeof content.role === "string" ? content.role : "user";
  const out = [];
  for (const part of listOf(content.parts)) {
    if (!isObject(part)) out.push({role, kind: "text", text: textOf(part)});
    else if (isObject(part.functionCall)) out.push({role, kind: "tool call", text: called(part.functionCall.name, json(part.functionCall.args))});
    else if (isObject(part.functionResponse)) out.push({role: "tool", kind: "tool result", text: json(part.functionResponse.response)});
    else if (typeof part.text === "string") out.push({role, kind: part.thought ? "reasoning" : "text", text: part.text});
    else out.push({role, kind: "text", text: json(part)});
  }
  return out;
}

function promptTurns(request) {
  if (!isObject(request)) return request === null || request === undefined ? [] : [{role: "prompt", kind: "text", text: json(request)}];
  const out = [];
  if (request.system) out.push({role: "system", kind: "text", text: textOf(request.system)});
  if (request.instructions) out.push({role: "system", kind: "text", text: textOf(request.instructions)});
  for (const m of listOf(request.messages)) out.push(...turnsOfMessage(isObject(m) ? m.role : "?", m));
  if (typeof request.input === "string") out.push({role: "user", kind: "text", text: request.input});
  else if (Array.isArray(request.input)) out.push(...turnsOfItems(request.input, "user"));
  if (request.prompt !== undefined) out.push({role: "prompt", kind: "text", text: textOf(request.prompt)});
  if (request.systemInstruction) {
    const system = request.systemInstruction;
    out.push({role: "system", kind: "text", text: textOf(isObject(system) ? system.parts : system)});
  }
  for (const c of listOf(request.contents)) out.push(...turnsOfContent(c));
  return out;
}

function answerTurns(response) {
  if (!isObject(response)) return [];
  const choice = listOf(response.choices)[0];
  if (isObject(choice)) {
    if (choice.message !== undefined) return turnsOfMessage("assistant", choice.message);
    if (choice.text !== undefined) return [{role: "assistant", kind: "text", text: textOf(choice.text)}];
  }
  if (Array.isArray(response.output)) return turnsOfItems(response.output, "assistant");
  if (Array.isArray(response.content)) return turnsOfMessage("assistant", {content: response.content});
  const candidate = listOf(response.candidates)[0];  // the Gemini API's
  if (isObject(candidate)) return turnsOfContent(candidate.content || {role: "model", parts: []});
  return [];
}

function turnList(turns, label) {
  return el("ol", {class: "turns", "aria-label": label}, turns.map((t) =>
    el("li", {class: "turn " + (ROLES.has(t.role) ? t.role : "other") + (t.kind === "text" ? "" : " " + t.kind.replace(" ", "-"))},
      el("span", {class: "role", text: t.kind === "text" ? t.role : `${t.role} · ${t.kind}`}),
      el("pre", {text: typeof t.text === "string" ? t.text : json(t.text)}))));
}

// Completion tokens as text, coloured by the probability the engine sampled them with (exp of the behaviour
// log-prob); the id on hover. The text is the engine tokenizer's (the server decodes each id: proxy/token_text.py);
// an id it could not decode shows as the id.
function tokenStrings(call) {
  if (Array.isArray(call.completion_token_text)) return call.completion_token_text.map((t) => (typeof t === "string" ? t : undefined));
  const choice = isObject(call.response) ? listOf(call.response.choices)[0] : null;
  const content = isObject(choice) && isObject(choice.logprobs) ? choice.logprobs.content : null;
  return Array.isArray(content) ? content.map((c) => (isObject(c) && typeof c.token === "string" ? c.token : undefined)) : null;
}

// What the trainer did with the call (calls.train_decision): trained, or the reason it was not.
export function decision(value) {
  if (value === null || value === undefined) return "not decided yet (its rollout is not trained)";
  if (value === "trained") return "trained";
  return "not trained: " + value;
}

function tokenView(call) {
  const ids = listOf(call.completion_token_ids);
  const logprobs = listOf(call.completion_logprobs);
  if (!ids.length) return el("p", {class: "muted", text: "No completion tokens recorded."});
  const strings = tokenStrings(call);
  const box = el("div", {class: "tokens", role: "group",
    "aria-label": `${ids.length} completion tokens, coloured by sampling probability`});
  ids.forEach((id, i) => {
    const lp = logprobs[i];
    const p = typeof lp === "number" ? Math.exp(lp) : null;
    const hue = p === null ? 0 : Math.round(120 * p);  // red (unlikely) to green (likely)
    const text = strings && strings[i] !== undefined ? strings[i] : null;
    const span = el("span", {class: "token" + (text === null ? " id" : ""), "data-id": id, "data-logprob": lp,
      title: `token ${id} · logprob ${fmt(lp, 4)}${p === null ? "" : " · p " + p.toFixed(3)}`},
      text === null ? String(id) : text);
    if (p !== null) span.style.setProperty("--hue", hue);
    box.append(span);
  });
  return box;
}

// A section that cannot be drawn from what was recorded shows what was recorded, as JSON.
function orRaw(draw, raw, what) {
  try {
    return draw();
  } catch (error) {
    return el("div", {class: "raw"}, el("p", {class: "muted", text: `The ${what} could not be shown as a conversation; as recorded:`}),
      el("pre", {class: "json", text: json(raw)}));
  }
}

export function callSection(call) {
  return orRaw(() => drawCall(call), call, "call");
}

function drawCall(call) {
  if (!isObject(call)) throw new TypeError("a call is an object");
  const facts = [
    ["route", call.route], ["model", call.model], ["policy", call.policy_name ? `${call.policy_name} v${fmt(call.policy)}` : fmt(call.policy)],
    ["status", call.status], ["finish", call.finish_reason], ["latency", typeof call.latency_ms === "number" ? `${fmt(call.latency_ms, 0)} ms` : "–"],
    ["prompt tokens", listOf(call.prompt_token_ids).length], ["completion tokens", listOf(call.completion_token_ids).length],
    ["training", decision(call.train_decision)],
  ];
  return el("section", {class: "call", "aria-label": `call ${fmt(call.seq)}`},
    el("h3", {text: `Call ${fmt(call.seq)} · ${fmt(call.call_id)}`}),
    el("dl", {class: "facts"}, facts.map(([k, v]) => [el("dt", {text: k}), el("dd", {text: fmt(v), "data-fact": k})])),
    el("details", {}, el("summary", {text: "Prompt as the agent sent it"}),
      orRaw(() => turnList(promptTurns(call.request), "prompt"), call.request, "prompt")),
    el("h4", {text: "Answer"}), orRaw(() => turnList(answerTurns(call.response), "answer"), call.response, "answer"),
    call.error ? el("p", {class: "error", text: fmt(call.error)}) : null,
    el("h4", {text: "Completion tokens"}), orRaw(() => tokenView(call), call.completion_token_ids, "token list"));
}

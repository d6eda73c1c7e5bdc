// rlproxy's web view: a read-only page over the proxy's JSON API. Every value from the server is put into the page
// as text (textContent, attributes), never as markup, so a recorded conversation cannot inject anything; the
// page's Content-Security-Policy forbids any other script too. The key lives in sessionStorage: this tab only.

const KEY = "rlproxy-key";
const content = document.getElementById("content");
const statusLine = document.getElementById("status");
let liveTimer = null;
let generation = 0;  // one per page shown: an answer that arrives after the user moved on is dropped

// --- small helpers --------------------------------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function say(message) { statusLine.textContent = message; }

function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(digits);
  return String(value);
}

function when(iso) { return iso ? iso.replace("T", " ").slice(0, 19) : "–"; }

function link(hash, text, label) { return el("a", {href: hash, "aria-label": label}, text); }

function enc(value) { return encodeURIComponent(value); }

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

class Stale extends Error {}

async function api(path) {
  const mine = generation;
  const headers = {};
  const key = sessionStorage.getItem(KEY);
  if (key) headers["Authorization"] = "Bearer " + key;
  const response = await fetch(path, {headers, credentials: "omit", cache: "no-store"});
  const body = await response.json().catch(() => null);
  if (mine !== generation) throw new Stale();
  if (!response.ok) {
    const message = (body && body.error && body.error.message) || response.statusText;
    throw new ApiError(response.status, message);
  }
  return body;
}

function failed(error) {
  if (error instanceof Stale) return;
  content.replaceChildren();
  if (error.status === 401 || error.status === 403) {
    content.append(el("h1", {text: "A key is needed"}),
      el("p", {text: "Enter an API key above. A project key shows that project's rollouts; the operator key shows all."}),
      el("p", {class: "error", text: error.message}));
    document.getElementById("key-input").focus();
  } else {
    content.append(el("h1", {text: "Could not load this page"}), el("p", {class: "error", text: error.message}));
  }
  say("");
}

// --- routes -----------------------------------------------------------------------------------------------------
function parseHash() {
  const [path, query = ""] = location.hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return {view: parts[0] || "rollouts", arg: parts[1], params: new URLSearchParams(query)};
}

async function render() {
  clearInterval(liveTimer);
  liveTimer = null;
  generation += 1;
  const {view, arg, params} = parseHash();
  for (const a of document.querySelectorAll("[data-nav]")) {
    if (a.dataset.nav === view) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  say("Loading…");
  try {
    if (view === "rollout" && arg) await rolloutView(arg);
    else if (view === "task" && arg) await taskView(arg);
    else if (view === "policies") await policiesView();
    else await rolloutsView(params);
  } catch (error) {
    failed(error);
  }
}

// --- the rollout list -------------------------------------------------------------------------------------------
const FILTERS = [
  ["project", "Project", "text"], ["agent", "Agent", "text"], ["task_id", "Task", "text"],
  ["status", "Status", ["", "open", "finished", "expired"]], ["reward_min", "Reward ≥", "number"],
  ["reward_max", "Reward ≤", "number"], ["policy", "Policy version", "number"],
  ["since", "Since", "datetime-local"], ["until", "Until", "datetime-local"],
  ["sort", "Sort", ["newest", "oldest", "reward_high", "reward_low"]],
];

async function rolloutsView(params) {
  const form = el("form", {class: "filters", "aria-label": "Filter rollouts"});
  for (const [name, label, kind] of FILTERS) {
    const id = "filter-" + name;
    let input;
    if (Array.isArray(kind)) {
      input = el("select", {id, name}, kind.map((option) => el("option", {value: option, text: option || "any"})));
      input.value = params.get(name) || kind[0];
    } else {
      input = el("input", {id, name, type: kind, step: kind === "number" ? "any" : null, value: params.get(name) || ""});
    }
    form.append(el("label", {for: id}, label), input);
  }
  const live = el("input", {type: "checkbox", id: "live", checked: params.get("live") !== "off"});
  form.append(el("label", {for: "live"}, "Live"), live, el("button", {type: "submit"}, "Apply"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    for (const [name] of FILTERS) {
      const value = form.elements[name].value;
      if (value && !(name === "sort" && value === "newest")) query.set(name, value);
    }
    if (!live.checked) query.set("live", "off");
    location.hash = "#/rollouts?" + query.toString();
  });

  const table = el("table", {"aria-label": "Rollouts"});
  const summary = el("p", {class: "summary"});
  const pager = el("div", {class: "pager"});
  content.replaceChildren(el("h1", {text: "Rollouts"}), form, summary, table, pager);

  const cursors = [null];  // the cursor of each page shown so far; the last is this page's
  async function load() {
    const query = new URLSearchParams();
    for (const [name] of FILTERS) {
      let value = params.get(name);
      if (value && (name === "since" || name === "until") && value.length === 16) value += ":00Z";
      if (value) query.set(name, value);
    }
    const cursor = cursors[cursors.length - 1];
    if (cursor) query.set("cursor", cursor);
    const page = await api("api/rollouts?" + query.toString());
    summary.textContent = `${page.total} rollout${page.total === 1 ? "" : "s"}; page ${cursors.length}`;
    table.replaceChildren(
      el("thead", {}, el("tr", {}, ["Started", "Rollout", "Task", "Agent", "Project", "Status", "Reward", "Policy",
        "Calls", "Trained"].map((h) => el("th", {scope: "col", text: h})))),
      el("tbody", {}, page.data.map((r) => el("tr", {},
        el("td", {text: when(r.created_at)}),
        el("td", {}, link("#/rollout/" + enc(r.rollout_id), r.rollout_id.slice(0, 12), "rollout " + r.rollout_id)),
        el("td", {}, r.task_id ? link("#/task/" + enc(r.task_id), r.task_id, "task " + r.task_id) : "–"),
        el("td", {text: fmt(r.agent)}), el("td", {text: fmt(r.project)}), el("td", {text: r.status}),
        el("td", {class: "num", text: fmt(r.reward)}), el("td", {class: "num", text: fmt(r.policy)}),
        el("td", {class: "num", text: fmt(r.calls)}), el("td", {text: r.trained ? "yes" : "no"}))))
    );
    pager.replaceChildren(
      el("button", {type: "button", disabled: cursors.length === 1,
        onclick: () => { cursors.pop(); load().catch(failed); }}, "Previous page"),
      el("button", {type: "button", disabled: !page.next,
        onclick: () => { cursors.push(page.next); load().catch(failed); }}, "Next page"));
    say(`Showing ${page.data.length} of ${page.total}`);
  }
  await load();
  if (live.checked) {  // new rollouts appear while a run goes on; only the first page moves
    liveTimer = setInterval(() => { if (cursors.length === 1) load().catch(() => {}); }, 3000);
  }
}

// --- one rollout ------------------------------------------------------------------------------------------------
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
  return JSON.stringify(content);
}

// A turn: {role, kind ("text" | "tool call" | "tool result" | "reasoning"), text}.
function turnsOfMessage(role, message) {
  const out = [];
  const reasoning = message.reasoning_content || message.reasoning;
  if (reasoning) out.push({role, kind: "reasoning", text: textOf(reasoning)});
  const content = message.content;
  if (Array.isArray(content)) {
    for (const block of content) {
      if (!block || typeof block !== "object") { out.push({role, kind: "text", text: textOf(block)}); continue; }
      if (block.type === "tool_use") out.push({role, kind: "tool call", text: `${block.name}(${JSON.stringify(block.input)})`});
      else if (block.type === "tool_result") out.push({role: "tool", kind: "tool result", text: textOf(block.content)});
      else if (block.type === "thinking" || block.type === "reasoning") out.push({role, kind: "reasoning", text: textOf(block)});
      else out.push({role, kind: "text", text: textOf(block)});
    }
  } else if (content !== null && content !== undefined && content !== "") {
    out.push({role: role === "tool" ? "tool" : role, kind: role === "tool" ? "tool result" : "text", text: textOf(content)});
  }
  for (const call of message.tool_calls || []) {
    const f = call.function || {};
    out.push({role, kind: "tool call", text: `${f.name}(${f.arguments})`});
  }
  return out;
}

function turnsOfItems(items, defaultRole) {  // Responses' input and output items
  const out = [];
  for (const item of items) {
    if (typeof item === "string") { out.push({role: defaultRole, kind: "text", text: item}); continue; }
    if (!item || typeof item !== "object") continue;
    if (item.type === "function_call") out.push({role: "assistant", kind: "tool call", text: `${item.name}(${item.arguments})`});
    else if (item.type === "function_call_output") out.push({role: "tool", kind: "tool result", text: textOf(item.output)});
    else if (item.type === "reasoning") out.push({role: "assistant", kind: "reasoning", text: textOf(item.summary || item.content)});
    else out.push(...turnsOfMessage(item.role || defaultRole, item));
  }
  return out;
}

function promptTurns(request) {
  if (!request || typeof request !== "object") return [];
  const out = [];
  if (request.system) out.push({role: "system", kind: "text", text: textOf(request.system)});
  if (request.instructions) out.push({role: "system", kind: "text", text: textOf(request.instructions)});
  if (Array.isArray(request.messages)) for (const m of request.messages) out.push(...turnsOfMessage(m.role, m));
  if (typeof request.input === "string") out.push({role: "user", kind: "text", text: request.input});
  else if (Array.isArray(request.input)) out.push(...turnsOfItems(request.input, "user"));
  if (request.prompt !== undefined) out.push({role: "prompt", kind: "text", text: textOf(request.prompt)});
  return out;
}

function answerTurns(response) {
  if (!response || typeof response !== "object") return [];
  if (Array.isArray(response.choices) && response.choices.length) {
    const choice = response.choices[0];
    if (choice.message) return turnsOfMessage("assistant", choice.message);
    if (choice.text !== undefined) return [{role: "assistant", kind: "text", text: choice.text}];
  }
  if (Array.isArray(response.output)) return turnsOfItems(response.output, "assistant");
  if (Array.isArray(response.content)) return turnsOfMessage("assistant", {content: response.content});
  return [];
}

function turnList(turns, label) {
  return el("ol", {class: "turns", "aria-label": label}, turns.map((t) =>
    el("li", {class: "turn " + t.role + (t.kind === "text" ? "" : " " + t.kind.replace(" ", "-"))},
      el("span", {class: "role", text: t.kind === "text" ? t.role : `${t.role} · ${t.kind}`}),
      el("pre", {text: t.text}))));
}

// Completion tokens coloured by the probability the engine sampled them with (exp of the behaviour log-prob).
function tokenStrings(call) {
  const content = call.response && call.response.choices && call.response.choices[0] &&
    call.response.choices[0].logprobs && call.response.choices[0].logprobs.content;
  return Array.isArray(content) ? content.map((c) => c.token) : null;
}

function tokenView(call) {
  const ids = call.completion_token_ids || [];
  const logprobs = call.completion_logprobs || [];
  if (!ids.length) return el("p", {class: "muted", text: "No completion tokens recorded."});
  const strings = tokenStrings(call);
  const box = el("div", {class: "tokens", role: "group",
    "aria-label": `${ids.length} completion tokens, coloured by sampling probability`});
  ids.forEach((id, i) => {
    const lp = logprobs[i];
    const p = typeof lp === "number" ? Math.exp(lp) : null;
    const hue = p === null ? 0 : Math.round(120 * p);  // red (unlikely) to green (likely)
    const span = el("span", {class: "token", "data-id": id, "data-logprob": lp,
      title: `token ${id} · logprob ${fmt(lp, 4)}${p === null ? "" : " · p " + p.toFixed(3)}`,
      style: null}, strings && strings[i] !== undefined ? strings[i] : String(id));
    if (p !== null) span.style.setProperty("--hue", hue);
    box.append(span);
  });
  return box;
}

function callSection(call) {
  const facts = [
    ["route", call.route], ["model", call.model], ["policy", call.policy_name ? `${call.policy_name} v${fmt(call.policy)}` : fmt(call.policy)],
    ["status", call.status], ["finish", call.finish_reason], ["latency", call.latency_ms === null ? "–" : `${fmt(call.latency_ms, 0)} ms`],
    ["prompt tokens", (call.prompt_token_ids || []).length], ["completion tokens", (call.completion_token_ids || []).length],
  ];
  return el("section", {class: "call", "aria-label": `call ${call.seq}`},
    el("h3", {text: `Call ${fmt(call.seq)} · ${call.call_id}`}),
    el("dl", {class: "facts"}, facts.map(([k, v]) => [el("dt", {text: k}), el("dd", {text: fmt(v)})])),
    el("details", {}, el("summary", {text: "Prompt as the agent sent it"}), turnList(promptTurns(call.request), "prompt")),
    el("h4", {text: "Answer"}), turnList(answerTurns(call.response), "answer"),
    call.error ? el("p", {class: "error", text: call.error}) : null,
    el("h4", {text: "Completion tokens"}), tokenView(call));
}

async function rolloutView(id) {
  const first = await api("api/rollouts/" + enc(id) + "?limit=20");
  const r = first.rollout;
  const calls = el("div", {class: "calls"});
  const more = el("div", {class: "pager"});
  const facts = [["task", r.task_id], ["agent", r.agent], ["project", r.project], ["status", r.status],
    ["reward", r.reward], ["policy", r.policy], ["calls", r.calls], ["trained", r.trained ? "yes" : "no"],
    ["eval", r.eval ? "yes" : "no"], ["started", when(r.created_at)], ["finished", when(r.finished_at)]];
  content.replaceChildren(
    el("h1", {text: "Rollout " + r.rollout_id}),
    el("dl", {class: "facts"}, facts.map(([k, v]) => [el("dt", {text: k}), el("dd", {}, k === "task" && v
      ? link("#/task/" + enc(v), v, "task " + v) : fmt(v))])),
    el("h2", {text: "Rewards"}),
    first.rewards.length ? el("table", {"aria-label": "Rewards"},
      el("thead", {}, el("tr", {}, ["Source", "Value", "Call", "Reason", "When"].map((h) => el("th", {scope: "col", text: h})))),
      el("tbody", {}, first.rewards.map((w) => el("tr", {}, el("td", {text: w.kind}), el("td", {class: "num", text: fmt(w.value)}),
        el("td", {text: fmt(w.call_id)}), el("td", {text: fmt(w.reason)}), el("td", {text: when(w.created_at)})))))
      : el("p", {class: "muted", text: "No reward yet."}),
    el("h2", {text: "Calls"}), calls, more);
  function add(page) {
    calls.append(...page.calls.map(callSection));
    more.replaceChildren(page.next === null ? el("p", {class: "muted", text: "All calls shown."}) :
      el("button", {type: "button", onclick: async () => {
        try { add(await api("api/rollouts/" + enc(id) + "?limit=20&after=" + page.next)); } catch (e) { failed(e); }
      }}, "More calls"));
  }
  add(first);
  say(`Rollout ${r.rollout_id}: ${r.calls} calls`);
}

// --- a task's group ---------------------------------------------------------------------------------------------
async function taskView(taskId) {
  const group = await api("api/tasks/" + enc(taskId));
  const rewards = group.data.filter((a) => a.reward !== null).map((a) => a.reward);
  const mean = rewards.length ? rewards.reduce((x, y) => x + y, 0) / rewards.length : null;
  content.replaceChildren(
    el("h1", {text: "Task " + taskId}),
    el("p", {text: `${group.data.length} attempts, ${rewards.length} rewarded, mean reward ${fmt(mean)}. ` +
      "Advantage: what GRPO compares, each finished attempt's reward against the group's mean and spread."}),
    el("table", {"aria-label": "Attempts of task " + taskId},
      el("thead", {}, el("tr", {}, ["Rollout", "Agent", "Status", "Reward", "Advantage", "Policy", "Calls", "Trained",
        "Started"].map((h) => el("th", {scope: "col", text: h})))),
      el("tbody", {}, group.data.map((a) => {
        const adv = a.advantage;
        const bar = el("span", {class: "bar " + (adv < 0 ? "neg" : "pos"), "aria-hidden": "true"});
        if (adv !== undefined) bar.style.setProperty("--size", Math.min(1, Math.abs(adv) / 2));
        return el("tr", {},
          el("td", {}, link("#/rollout/" + enc(a.rollout_id), a.rollout_id.slice(0, 12), "rollout " + a.rollout_id)),
          el("td", {text: fmt(a.agent)}), el("td", {text: a.status}), el("td", {class: "num", text: fmt(a.reward)}),
          el("td", {class: "num"}, adv === undefined ? "–" : [adv.toFixed(3), bar]),
          el("td", {class: "num", text: fmt(a.policy)}), el("td", {class: "num", text: fmt(a.calls)}),
          el("td", {text: a.trained ? "yes" : "no"}), el("td", {text: when(a.created_at)}));
      }))));
  say(`Task ${taskId}: ${group.data.length} attempts`);
}

// --- policies ---------------------------------------------------------------------------------------------------
function lineage(versions) {
  const children = new Map();
  for (const v of versions) {
    const parent = v.parent_version === null ? "root" : v.parent_version;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(v);
  }
  const known = new Set(versions.map((v) => v.version));
  const roots = versions.filter((v) => v.parent_version === null || !known.has(v.parent_version));
  const branch = (v) => el("li", {},
    el("span", {class: "version " + v.status, text: `v${v.version} · ${v.status}` + (v.activated_at ? ` · active since ${when(v.activated_at)}` : "")}),
    children.has(v.version) ? el("ul", {}, children.get(v.version).map(branch)) : null);
  return el("ul", {class: "lineage", "aria-label": "Lineage"}, roots.map(branch));
}

function chart(versions) {  // held-out (evaluation traffic) success by version, with its 95% interval
  const points = versions.filter((v) => v.evaluation_traffic && v.evaluation_traffic.mean !== null)
    .sort((a, b) => a.version - b.version);
  if (!points.length) return el("p", {class: "muted", text: "No evaluation traffic measured yet."});
  const w = 480, h = 160, pad = 28;
  const x = (i) => pad + (points.length === 1 ? (w - 2 * pad) / 2 : i * (w - 2 * pad) / (points.length - 1));
  const y = (value) => h - pad - value * (h - 2 * pad);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "Held-out success by version: " + points.map((p) =>
    `v${p.version} ${fmt(p.evaluation_traffic.mean)}`).join(", "));
  const add = (tag, attrs) => { const n = document.createElementNS(ns, tag); for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v); svg.append(n); return n; };
  add("line", {x1: pad, y1: y(0), x2: w - pad, y2: y(0), class: "axis"});
  add("line", {x1: pad, y1: y(1), x2: w - pad, y2: y(1), class: "axis faint"});
  points.forEach((p, i) => {
    const ci = p.evaluation_traffic.ci95;
    if (ci) add("line", {x1: x(i), y1: y(Math.min(1, ci[1])), x2: x(i), y2: y(Math.max(0, ci[0])), class: "ci"});
    add("circle", {cx: x(i), cy: y(Math.max(0, Math.min(1, p.evaluation_traffic.mean))), r: 4, class: "point"});
    add("text", {x: x(i), y: h - 8, class: "label"}).textContent = "v" + p.version;
  });
  add("polyline", {points: points.map((p, i) => `${x(i)},${y(Math.max(0, Math.min(1, p.evaluation_traffic.mean)))}`).join(" "), class: "trend"});
  return svg;
}

function verdicts(v) {
  if (!v.evaluation || !Object.keys(v.evaluation).length) return "–";
  return el("pre", {class: "json", text: JSON.stringify(v.evaluation, null, 1)});
}

function agreementCell(v) {  // the engines against the trainer on the calls this version served (docs/learning.md)
  const a = v.agreement;
  if (!a) return "–";
  return el("span", {class: a.alarm ? "error" : null, title: `mean |Δ log-prob| ${fmt(a.mean_abs, 4)} over ${a.tokens} tokens`},
    `KL ${fmt(a.kl, 4)}${a.alarm ? " — ALERT: not the trained weights" : ""}`);
}

async function policiesView() {
  const overview = await api("../policies");
  const names = Object.keys(overview.policies).sort();
  content.replaceChildren(el("h1", {text: "Policies"}));
  for (const name of names) {
    const listed = name === overview.policy ? overview : await api("../policies?policy=" + enc(name));
    const versions = listed.data;
    content.append(el("section", {class: "policy", "aria-label": "policy " + name},
      el("h2", {text: `${name} — serving v${listed.active}`}),
      el("h3", {text: "Held-out success by version"}), chart(versions),
      el("h3", {text: "Lineage"}), lineage(versions),
      el("h3", {text: "Versions"}),
      el("table", {"aria-label": "Versions of " + name},
        el("thead", {}, el("tr", {}, ["Version", "Parent", "Status", "Created", "Active since", "Eval traffic",
          "Served as trained", "Gate, canary and held-out verdicts"].map((h) => el("th", {scope: "col", text: h})))),
        el("tbody", {}, versions.map((v) => el("tr", {},
          el("td", {class: "num", text: "v" + v.version}), el("td", {class: "num", text: fmt(v.parent_version)}),
          el("td", {text: v.status}), el("td", {text: when(v.created_at)}), el("td", {text: when(v.activated_at)}),
          el("td", {text: v.evaluation_traffic && v.evaluation_traffic.n ? `${fmt(v.evaluation_traffic.mean)} (n=${v.evaluation_traffic.n})` : "–"}),
          el("td", {}, agreementCell(v)), el("td", {}, verdicts(v))))))));
  }
  say(`${names.length} polic${names.length === 1 ? "y" : "ies"}`);
}

// --- the key ----------------------------------------------------------------------------------------------------
document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("key-input");
  if (input.value) sessionStorage.setItem(KEY, input.value.trim());
  input.value = "";
  render();
});
document.getElementById("key-forget").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  render();
});
window.addEventListener("hashchange", () => { render(); content.focus(); });
render();

// rlproxy's web view: a read-only page over the proxy's JSON API. Every value from the server is put into the page
// as text (textContent, attributes), never as markup, so a recorded conversation cannot inject anything; the
// page's Content-Security-Policy forbids any other script too. The key lives in sessionStorage: this tab only.
// Modules: common.js (elements, formatting, the API), turns.js (one call as a conversation), policies.js,
// training.js (the steps over time, drawn by charts.js).
import {ApiError, KEY, api, content, el, enc, failed, fmt, link, say, shown, taskApi, when} from "./common.js";
import {callSection} from "./turns.js";
import {policiesView} from "./policies.js";
import {trainingView} from "./training.js";

let liveTimer = null;

// --- routes -----------------------------------------------------------------------------------------------------
function decoded(part) {
  try { return decodeURIComponent(part); } catch (error) { return null; }  // a stray "%": a link no page made
}

function parseHash() {
  const hash = location.hash.replace(/^#/, "");
  const cut = hash.indexOf("?");
  const path = cut < 0 ? hash : hash.slice(0, cut);
  const parts = path.split("/").filter(Boolean).map(decoded);
  return {view: parts[0] || "rollouts", arg: parts[1], params: new URLSearchParams(cut < 0 ? "" : hash.slice(cut + 1)),
    broken: parts.includes(null)};
}

async function render() {
  clearInterval(liveTimer);
  liveTimer = null;
  shown.generation += 1;
  say("Loading…");
  try {
    const {view, arg, params, broken} = parseHash();
    for (const a of document.querySelectorAll("[data-nav]")) {
      if (a.dataset.nav === view) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
    }
    if (broken) throw new ApiError(400, "This link is not valid: it holds a % that is no escape of a character.");
    if (view === "rollout" && arg) await rolloutView(arg);
    else if (view === "task" && arg) await taskView(arg);
    else if (view === "policies") await policiesView();
    else if (view === "training") await trainingView();
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

// The datetime-local widget shows and gives the browser's local time ("2026-11-27T09:00", no zone); the API takes an
// instant, so the local time is sent as the UTC instant it is. A value with a zone (typed into the link) goes as is.
function instant(value) {
  if (!/^\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d+)?)?$/.test(value)) return value;
  const moment = new Date(value);  // a date-time without a zone is local time (ECMAScript)
  return Number.isNaN(moment.getTime()) ? value : moment.toISOString();
}

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
  let counted = null;  // "58 rollouts": the server counts on the first page only (up to a cap)
  let latest = 0;  // the newest load asked for: a Live refresh answered after "Next page" must not land last
  async function load() {
    const mine = ++latest;
    const number = cursors.length;
    const query = new URLSearchParams();
    for (const [name] of FILTERS) {
      let value = params.get(name);
      if (value && (name === "since" || name === "until")) value = instant(value);
      if (value) query.set(name, value);
    }
    const cursor = cursors[cursors.length - 1];
    if (cursor) query.set("cursor", cursor);
    const page = await api("api/rollouts?" + query.toString());
    if (mine !== latest) return;
    if (typeof page.total === "number") {
      counted = page.total_exact === false ? `more than ${page.total} rollouts`
        : `${page.total} rollout${page.total === 1 ? "" : "s"}`;
    }
    summary.textContent = `${counted ?? "Rollouts"}; page ${number}`;
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
      el("button", {type: "button", disabled: number === 1,
        onclick: () => { cursors.pop(); load().catch(failed); }}, "Previous page"),
      el("button", {type: "button", disabled: !page.next,
        onclick: () => { cursors.push(page.next); load().catch(failed); }}, "Next page"));
    say(`Showing ${page.data.length}${counted ? " of " + counted : ""}`);
  }
  await load();
  if (live.checked) {  // new rollouts appear while a run goes on; only the first page moves
    liveTimer = setInterval(() => { if (cursors.length === 1) load().catch(() => {}); }, 3000);
  }
}

// --- one rollout ------------------------------------------------------------------------------------------------
async function rolloutView(id) {
  // A page of calls ends at 20 calls or at the server's byte budget (store/rollout_view.py), whichever comes first.
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
      el("button", {type: "button", onclick: async (event) => {
        event.currentTarget.disabled = true;  // one click, one page: a second would append the same calls again
        try { add(await api("api/rollouts/" + enc(id) + "?limit=20&after=" + page.next)); } catch (e) { failed(e); }
      }}, "More calls"));
  }
  add(first);
  say(`Rollout ${r.rollout_id}: ${r.calls} calls`);
}

// --- a task's group ---------------------------------------------------------------------------------------------
async function taskView(taskId) {
  const group = await api(taskApi(taskId));
  const rewards = group.data.filter((a) => a.reward !== null).map((a) => a.reward);
  const mean = rewards.length ? rewards.reduce((x, y) => x + y, 0) / rewards.length : null;
  content.replaceChildren(
    el("h1", {text: "Task " + taskId}),
    el("p", {text: `${group.data.length} attempts${group.truncated ? " (the newest; older ones are not listed)" : ""}, ` +
      `${rewards.length} rewarded, mean reward ${fmt(mean)}. Advantage: what GRPO would give each finished attempt ` +
      "that is not evaluation traffic, its reward against the mean and spread of those listed from its project " +
      "(a training step compares only the attempts it trains)."}),
    el("table", {"aria-label": "Attempts of task " + taskId},
      el("thead", {}, el("tr", {}, ["Rollout", "Agent", "Status", "Reward", "Advantage", "Eval", "Policy", "Calls",
        "Trained", "Started"].map((h) => el("th", {scope: "col", text: h})))),
      el("tbody", {}, group.data.map((a) => {
        const adv = a.advantage;
        const bar = el("span", {class: "bar " + (adv < 0 ? "neg" : "pos"), "aria-hidden": "true"});
        if (adv !== undefined) bar.style.setProperty("--size", Math.min(1, Math.abs(adv) / 2));
        return el("tr", {},
          el("td", {}, link("#/rollout/" + enc(a.rollout_id), a.rollout_id.slice(0, 12), "rollout " + a.rollout_id)),
          el("td", {text: fmt(a.agent)}), el("td", {text: a.status}), el("td", {class: "num", text: fmt(a.reward)}),
          el("td", {class: "num"}, adv === undefined ? "–" : [adv.toFixed(3), bar]),
          el("td", {text: a.eval ? "yes" : "no"}),
          el("td", {class: "num", text: fmt(a.policy)}), el("td", {class: "num", text: fmt(a.calls)}),
          el("td", {text: a.trained ? "yes" : "no"}), el("td", {text: when(a.created_at)}));
      }))));
  say(`Task ${taskId}: ${group.data.length} attempts`);
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

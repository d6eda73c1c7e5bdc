// The training page: per named policy, its steps over time as the trainer recorded them (GET /ui/api/training):
// reward, held-out success of the version each step made, the yield by reason, staleness, KL, clip fraction and
// the served-as-trained agreement: what the Grafana dashboard's Training row shows, without Grafana.
import {ApiError, api, content, el, enc, fmt, say, when} from "./common.js";
import {lineChart, yieldChart} from "./charts.js";

const SHOWN_ROWS = 10;

function heldOut(versions) {  // version -> mean held-out (evaluation traffic) success
  const out = new Map();
  for (const v of versions) {
    if (v.evaluation_traffic && typeof v.evaluation_traffic.mean === "number") out.set(v.version, v.evaluation_traffic.mean);
  }
  return out;
}

function policySection(name, steps, versions) {
  const labels = steps.map((s) => (s.version === null ? `step ${s.step_id}` : `v${s.version}`));
  const series = (field) => steps.map((s) => s[field]);
  const success = heldOut(versions);
  const trained = steps.filter((s) => s.version !== null).length;
  const seen = steps.reduce((n, s) => n + (s.calls_seen || 0), 0);
  const kept = steps.reduce((n, s) => n + (s.calls_trained || 0), 0);
  const charts = steps.length ? [
    lineChart("Step reward (mean final reward of the batch)", labels, [{name: "reward", values: series("reward_mean")}]),
    lineChart("Held-out success of the version each step made", labels,
      [{name: "held-out", values: steps.map((s) => (s.version === null ? null : success.get(s.version) ?? null))}],
      {low: 0, high: 1}),
    yieldChart("Calls per step: trained, and not trained by reason", steps.map((s, i) => ({
      label: labels[i], trained: s.calls_trained || 0, skipped: s.calls_skipped || {}}))),
    lineChart("Staleness (versions behind, of the calls trained)", labels, [
      {name: "mean lag", values: steps.map((s) => s.staleness.lag_mean)},
      {name: "max lag", values: steps.map((s) => s.staleness.lag_max)}], {low: 0}),
    lineChart("KL to the base model", labels, [{name: "kl", values: series("kl")}], {low: 0}),
    lineChart("Clip fraction", labels, [{name: "clip fraction", values: series("clip_fraction")}], {low: 0}),
    lineChart("Served as trained (engine vs trainer KL per token, lag 0)", labels,
      [{name: "agreement KL", values: series("agreement_kl")}], {low: 0}),
    // a policy with a teacher (docs/distillation.md): the gap it learns to close, falling as it learns
    steps.some((s) => typeof s.teacher_kl === "number") ? lineChart(
      "Teacher gap (reverse KL to the teacher per sampled token)", labels,
      [{name: "teacher KL", values: series("teacher_kl")}], {low: 0}) : null,
  ].filter(Boolean) : [el("p", {class: "muted", text: "No training step recorded yet."})];
  const recent = steps.slice(-SHOWN_ROWS).reverse();
  return el("section", {class: "policy", "aria-label": "training of " + name},
    el("h2", {text: `${name} — ${trained} version${trained === 1 ? "" : "s"} trained in ${steps.length} steps`}),
    el("p", {text: seen ? `${kept} of ${seen} calls trained (${(100 * kept / seen).toFixed(0)}%) over these steps.`
      : "No calls seen by these steps."}),
    el("div", {class: "charts"}, charts),
    recent.length ? el("table", {"aria-label": "Latest steps of " + name},
      el("thead", {}, el("tr", {}, ["Step", "Made", "When", "Reward", "Calls trained", "Not trained", "Loss", "KL",
        "Clip fraction"].map((h) => el("th", {scope: "col", text: h})))),
      el("tbody", {}, recent.map((s) => el("tr", {},
        el("td", {class: "num", text: String(s.step_id)}), el("td", {text: s.version === null ? "nothing" : "v" + s.version}),
        el("td", {text: when(s.at)}), el("td", {class: "num", text: fmt(s.reward_mean)}),
        el("td", {class: "num", text: `${s.calls_trained}/${s.calls_seen}`}),
        el("td", {text: Object.entries(s.calls_skipped || {}).map(([r, n]) => `${r} ${n}`).join(", ") || "–"}),
        el("td", {class: "num", text: fmt(s.loss, 4)}), el("td", {class: "num", text: fmt(s.kl, 4)}),
        el("td", {class: "num", text: fmt(s.clip_fraction)}))))) : null);
}

export async function trainingView() {
  const overview = await api("../policies");
  const names = Object.keys(overview.policies).sort();
  content.replaceChildren(el("h1", {text: "Training"}));
  for (const name of names) {
    let steps;
    try {
      steps = (await api("api/training?policy=" + enc(name))).data;
    } catch (error) {
      if (!(error instanceof ApiError) || error.status !== 403) throw error;
      content.append(el("p", {class: "muted", text: error.message}));
      say("");
      return;
    }
    const listed = name === overview.policy ? overview : await api("../policies?policy=" + enc(name));
    content.append(policySection(name, steps, listed.data));
  }
  say(`Training of ${names.length} polic${names.length === 1 ? "y" : "ies"}`);
}

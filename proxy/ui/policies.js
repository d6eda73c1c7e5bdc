// The policies page: each named policy's versions, their lineage, held-out success and verdicts (GET /policies).
import {api, content, el, enc, fmt, isObject, say, when} from "./common.js";

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

// A verdict record as fields: each key a term, each value a number, text, a list, or fields again.
function fields(value, depth = 0) {
  if (isObject(value) && depth < 6) {
    return el("dl", {class: "fields"}, Object.entries(value).map(([k, v]) => [el("dt", {text: k.replaceAll("_", " ")}),
      el("dd", {}, fields(v, depth + 1))]));
  }
  if (Array.isArray(value) && value.every((x) => !isObject(x) && !Array.isArray(x))) return value.map((x) => fmt(x)).join(", ") || "–";
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (typeof value === "string" && /^\d{4}-\d\d-\d\dT\d\d:\d\d/.test(value)) return when(value);
  return fmt(value);
}

function verdicts(v) {
  if (!v.evaluation || !Object.keys(v.evaluation).length) return "–";
  return fields(v.evaluation);
}

// What the trainer did with the policy's calls over its last steps (GET /policies `yields`; the operator's only).
function yieldLine(report) {
  if (!report) return null;
  if (!report.calls_seen) return el("p", {class: "muted", text: `No calls seen by its last ${report.steps} steps.`});
  const skipped = Object.entries(report.calls_skipped).sort((a, b) => b[1] - a[1]).map(([r, n]) => `${r} ${n}`).join(", ");
  return el("p", {class: "yield", text: `Last ${report.steps} steps: ${report.calls_trained} of ${report.calls_seen} ` +
    `calls trained (${(100 * report.share_trained).toFixed(0)}%)` + (skipped ? `; not trained: ${skipped}` : "")});
}

function agreementCell(v) {  // the engines against the trainer on the calls this version served (docs/learning.md)
  const a = v.agreement;
  if (!a) return "–";
  return el("span", {class: a.alarm ? "error" : null, title: `mean |Δ log-prob| ${fmt(a.mean_abs, 4)} over ${a.tokens} tokens`},
    `KL ${fmt(a.kl, 4)}${a.alarm ? " — ALERT: not the trained weights" : ""}`);
}

export async function policiesView() {
  const overview = await api("../policies");
  const names = Object.keys(overview.policies).sort();
  content.replaceChildren(el("h1", {text: "Policies"}));
  for (const name of names) {
    const listed = name === overview.policy ? overview : await api("../policies?policy=" + enc(name));
    const versions = listed.data;
    content.append(el("section", {class: "policy", "aria-label": "policy " + name},
      el("h2", {text: `${name} — serving v${listed.active}`}),
      yieldLine(overview.yields ? overview.yields[name] : null),
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

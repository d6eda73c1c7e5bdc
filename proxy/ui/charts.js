// Small SVG charts for the training page, drawn from numbers only (no markup from the server). Each chart says
// what it shows in its aria-label, so a screen reader (and a test) reads the values it draws.
import {el, fmt, isObject} from "./common.js";

const NS = "http://www.w3.org/2000/svg";
const W = 480, H = 170, PAD = 30;

function svgOf(label) {
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  return {svg, add};
}

// An axis bound as few digits as say it (0.001 is not "0.00").
function tick(value) {
  if (value === 0 || Math.abs(value) >= 0.01) return fmt(value, 2);
  return value.toExponential(0);
}

function scale(values, low, high) {
  const finite = values.filter((v) => typeof v === "number" && Number.isFinite(v));
  let lo = low ?? Math.min(...finite), hi = high ?? Math.max(...finite);
  if (!finite.length) { lo = 0; hi = 1; }
  if (hi === lo) { hi = lo + (lo === 0 ? 1 : Math.abs(lo)); }
  return {lo, hi, y: (v) => H - PAD - (v - lo) / (hi - lo) * (H - 2 * PAD)};
}

// One line per series over the steps (x: the step's position), with the axis' bounds written at its ends.
// series: [{name, values: [number | null per step]}]; a null is a step that did not measure it (no point).
export function lineChart(title, steps, series, {low, high} = {}) {
  const all = series.flatMap((s) => s.values);
  if (!all.some((v) => typeof v === "number")) return el("p", {class: "muted", text: `${title}: nothing measured yet.`});
  const {lo, hi, y} = scale(all, low, high);
  const x = (i) => PAD + (steps.length === 1 ? (W - 2 * PAD) / 2 : i * (W - 2 * PAD) / (steps.length - 1));
  const described = series.map((s) => `${s.name}: ` + s.values.map((v, i) => typeof v === "number"
    ? `${steps[i]} ${fmt(v, 4)}` : null).filter(Boolean).join(", ")).join("; ");
  const {svg, add} = svgOf(`${title}. ${described}`);
  add("line", {x1: PAD, y1: y(lo), x2: W - PAD, y2: y(lo), class: "axis"});
  add("text", {x: 2, y: y(lo), class: "label start"}, tick(lo));
  add("text", {x: 2, y: y(hi) + 4, class: "label start"}, tick(hi));
  add("text", {x: W / 2, y: 12, class: "label"}, title);
  series.forEach((s, n) => {
    const points = s.values.map((v, i) => (typeof v === "number" ? [x(i), y(Math.max(lo, Math.min(hi, v)))] : null));
    const drawn = points.filter(Boolean);
    if (drawn.length > 1) add("polyline", {points: drawn.map((p) => p.join(",")).join(" "), class: `trend s${n}`});
    for (const p of drawn) add("circle", {cx: p[0], cy: p[1], r: 2.5, class: `point s${n}`});
  });
  return el("figure", {class: "chart"}, svg, legend(series.map((s) => s.name)));
}

// Per step, one bar of its calls: trained at the bottom, then each skip reason stacked on it.
// steps: [{label, trained, skipped: {reason: n}}]
export function yieldChart(title, steps) {
  const reasons = [...new Set(steps.flatMap((s) => Object.keys(isObject(s.skipped) ? s.skipped : {})))].sort();
  const totals = steps.map((s) => s.trained + reasons.reduce((sum, r) => sum + ((s.skipped || {})[r] || 0), 0));
  if (!totals.some((t) => t > 0)) return el("p", {class: "muted", text: `${title}: no calls seen yet.`});
  const {y} = scale(totals, 0);
  const width = Math.max(2, (W - 2 * PAD) / steps.length - 2);
  const described = steps.map((s, i) => `${s.label}: ${s.trained}/${totals[i]} trained` +
    reasons.filter((r) => (s.skipped || {})[r]).map((r) => `, ${r} ${s.skipped[r]}`).join("")).join("; ");
  const {svg, add} = svgOf(`${title}. ${described}`);
  add("text", {x: W / 2, y: 12, class: "label"}, title);
  add("text", {x: 2, y: y(Math.max(...totals)) + 4, class: "label start"}, String(Math.max(...totals)));
  steps.forEach((s, i) => {
    let base = 0;
    const left = PAD + i * (W - 2 * PAD) / steps.length;
    const parts = [["trained", s.trained], ...reasons.map((r) => [r, (s.skipped || {})[r] || 0])];
    parts.forEach(([name, count], n) => {
      if (!count) return;
      add("rect", {x: left, y: y(base + count), width, height: Math.max(0.5, y(base) - y(base + count)),
        class: `bar-part s${n}`, "data-reason": name});
      base += count;
    });
  });
  return el("figure", {class: "chart"}, svg, legend(["trained", ...reasons]));
}

function legend(names) {
  return el("figcaption", {class: "legend"}, names.map((name, n) => el("span", {class: `key s${n}`, text: name})));
}

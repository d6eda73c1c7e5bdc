// What every view of the page shares: building elements, formatting values, reading the JSON API.
// Every value from the server is put into the page as text (textContent, attributes), never as markup.

export const KEY = "rlproxy-key";
export const content = document.getElementById("content");
const statusLine = document.getElementById("status");
// One per page shown: an answer that arrives after the user moved on is dropped (api() throws Stale).
export const shown = {generation: 0};

export function el(tag, attrs = {}, ...children) {
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

export function say(message) { statusLine.textContent = message; }

export function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(digits);
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

export function when(iso) { return typeof iso === "string" ? iso.replace("T", " ").slice(0, 19) : "–"; }

export function link(hash, text, label) { return el("a", {href: hash, "aria-label": label}, text); }

export function enc(value) { return encodeURIComponent(value); }

// A task's API path. A path segment "." or ".." (or its %2E spelling) is resolved away by the browser before the
// request leaves (URL standard), so those two ids go in the query instead.
export function taskApi(taskId) {
  return taskId === "." || taskId === ".." ? "api/tasks/-?task_id=" + enc(taskId) : "api/tasks/" + enc(taskId);
}

export const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);
export const listOf = (value) => (Array.isArray(value) ? value : []);

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

export class Stale extends Error {}

export async function api(path) {
  const mine = shown.generation;
  const headers = {};
  const key = sessionStorage.getItem(KEY);
  if (key) headers["Authorization"] = "Bearer " + key;
  const response = await fetch(path, {headers, credentials: "omit", cache: "no-store"});
  const body = await response.json().catch(() => null);
  if (mine !== shown.generation) throw new Stale();
  if (!response.ok) {
    const message = (body && body.error && body.error.message) || response.statusText;
    throw new ApiError(response.status, message);
  }
  return body;
}

export function failed(error) {
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

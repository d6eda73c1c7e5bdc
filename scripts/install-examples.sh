#!/usr/bin/env bash
# Give each example framework whose pins clash with the engine's stack its own virtualenv:
# examples/requirements-<name>.txt -> $VENV/examples/<name> (a link inside the main venv's folder, so
# `make clean` and .gitignore cover it, to a venv in the cache below). The frameworks that fit the main venv
# are its `examples` extra instead.
# Only what changed is installed: a venv is built when its requirements file (or the Python) differs from
# those of every venv built before.
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
cd "$(dirname "$0")/.."

# The venvs themselves live in a cache outside the checkout, one per requirements file and Python version
# (RLPROXY_CACHE_DIR, else ~/.cache/rlproxy), linked into $VENV/examples: a fresh clone or `make clean` reuses
# them instead of installing the same frameworks again (about two minutes). A venv is built where it stays
# (venvs cannot be moved) and counts only once its `.complete` stamp is written.
CACHE="${RLPROXY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlproxy}/example-venvs"
PY_VERSION=$("$PYTHON" -c 'import sys; print(sys.version)')
mkdir -p "$VENV/examples" "$CACHE"

for requirements in examples/requirements-*.txt; do
  name=$(basename "$requirements" .txt)
  target="$VENV/examples/${name#requirements-}"
  if cmp -s "$requirements" "$target/requirements.txt"; then
    continue
  fi
  key=$( (cat "$requirements"; echo "$PY_VERSION") | sha256sum | cut -c1-16)
  built="$CACHE/${name#requirements-}-$key"
  if [ ! -f "$built/.complete" ]; then
    started=$SECONDS
    rm -rf "$built"
    "$PYTHON" -m venv "$built"
    "$built/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q -r "$requirements"
    cp "$requirements" "$built/requirements.txt"
    touch "$built/.complete"
    echo "installed $built in $((SECONDS - started))s"
  fi
  rm -rf "$target"
  ln -s "$built" "$target"
done

#!/usr/bin/env bash
# Give each example framework whose pins clash with the engine's stack its own virtualenv:
# examples/requirements-<name>.txt -> $VENV/examples/<name> (inside the main venv's folder, so `make clean`
# and .gitignore cover it). The frameworks that fit the main venv are its `examples` extra instead.
# Only what changed is installed: a venv is updated when its requirements file differs from the one it
# was built with.
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
cd "$(dirname "$0")/.."

for requirements in examples/requirements-*.txt; do
  name=$(basename "$requirements" .txt)
  target="$VENV/examples/${name#requirements-}"
  if cmp -s "$requirements" "$target/requirements.txt"; then
    continue
  fi
  started=$SECONDS
  [ -x "$target/bin/python" ] || "$PYTHON" -m venv "$target"
  "$target/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q -r "$requirements"
  cp "$requirements" "$target/requirements.txt"
  echo "installed $target in $((SECONDS - started))s"
done

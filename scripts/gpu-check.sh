#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py): the CUDA paths of searchr1 in a few minutes on one GPU, with the
# machine's own PyTorch / transformers / peft and nothing downloaded. Runs on a CPU too (CUDA parts skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
exec "$PY" scripts/gpu_check.py "$@"

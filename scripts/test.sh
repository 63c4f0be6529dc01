#!/usr/bin/env bash
# Sets up .venv (idempotent) and runs the test suite: ruff, then pytest.
#   scripts/test.sh            the default suite (< 15 minutes on 2 cores)
#   scripts/test.sh --slow     only the tests marked slow
#   scripts/test.sh --vllm     sets up .venv-vllm (scripts/setup-vllm.sh), then only the vLLM engine's tests
#   scripts/test.sh -k bm25    extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check searchr1 tests
marker=()
if [ "${1:-}" = "--slow" ]; then shift; marker=(-m slow); fi
if [ "${1:-}" = "--vllm" ]; then
  shift
  bash scripts/setup-vllm.sh
  marker=(-m vllm)
  export SEARCHR1_VLLM_TESTS=1  # without it the tests marked vllm skip, naming this command
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest "${marker[@]}" -q -ra "$@"

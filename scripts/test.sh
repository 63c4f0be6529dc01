#!/usr/bin/env bash
# Sets up .venv (idempotent) and runs the test suite: ruff, then pytest. Targets (.ci/run runs the first three):
#   scripts/test.sh              the default suite: every test not marked slow (< 15 minutes on 2 cores)
#   scripts/test.sh --slow       the deterministic slow tests: torchrun DDP/FSDP, the GGUF loader, the quick
#                                benches, the real model end to end (not the learning ones)
#   scripts/test.sh --vllm       sets up .venv-vllm (scripts/setup-vllm.sh), then the vLLM engine's tests
#   scripts/test.sh --learning   the statistical learning tests (the reward rises: GRPO / PPO over seeds, the
#                                quick demo); not in CI
#   scripts/test.sh -k bm25      extra arguments go to pytest (after a target too)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check searchr1 tests
marker=()
case "${1:-}" in
  --slow) shift; marker=(-m "slow and not learning") ;;
  --learning) shift; marker=(-m learning) ;;
  --vllm)
    shift
    bash scripts/setup-vllm.sh
    marker=(-m vllm)
    export SEARCHR1_VLLM_TESTS=1  # without it the tests marked vllm skip, naming this command
    ;;
esac
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest "${marker[@]}" -q -ra "$@"

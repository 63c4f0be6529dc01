#!/usr/bin/env bash
# Sets up .venv (idempotent) and runs the demo on the embedded synthetic world.
#   scripts/demo.sh                      the quick learning demo (`searchr1 demo --quick`): SmolLM2-135M-Instruct,
#                                        seed 0, the recipe's GRPO steps (searchr1/configs/demo_learning.yaml);
#                                        its measured time: README.md (stated there only)
#   scripts/demo.sh --seeds 0 1 2 ...    any arguments go to `searchr1 demo` instead (the full demo: 3 seeds,
#                                        controls, the outcome-only ablation)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ $# -eq 0 ]; then set -- --quick; fi
exec .venv/bin/searchr1 demo "$@"

#!/usr/bin/env bash
# Sets up .venv (idempotent) and runs the demo on the embedded synthetic world.
#   scripts/demo.sh [--quick] [--out DIR] ...   (arguments go to `searchr1 demo`)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/searchr1 demo "$@"

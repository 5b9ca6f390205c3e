#!/usr/bin/env bash
# The GPU check: one prepared script for a machine lent with an NVIDIA GPU (the device tool), under
# 8 minutes, that never changes the device's settings (no nvidia-smi -pm/-ac/-lgc, no reset).
#
#   bash benchmarks/gpu/check.sh [OUT_DIR]
#
# It needs a Python with numpy, onnx and an ONNX Runtime built with CUDA (onnxruntime-gpu). The
# device image has numpy, onnx and a CPU-only onnxruntime and reaches no package index: wheels
# found in .whl/ (carried with the run) are installed first into /tmp/site. Exit codes: 0 every row
# measured and right; 1 a wrong answer (an accelerated output off the CPU's beyond tolerance);
# 2 no CUDA provider in this ONNX Runtime (CPU rows only, GPU rows NOT measured); 3 no GPU visible.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-/tmp/gpu-check}}
mkdir -p "$out"
py=${PYTHON:-python3}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "check.sh: no NVIDIA GPU visible (nvidia-smi -L failed or is absent): nothing measured"
  exit 3
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "check.sh: installing the carried wheels failed"; exit 2; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/src" PYTHONUNBUFFERED=1

providers=$("$py" -c 'import onnxruntime as o; print(o.__version__, ",".join(o.get_available_providers()))') \
  || { echo "check.sh: no onnxruntime importable with $py"; exit 2; }
echo "onnxruntime: $providers" | tee -a "$out/gpu.txt"

status=0
timeout 300 "$py" benchmarks/gpu/check_models.py --providers cpu,cuda,trt,trt-fp16 --out "$out/check.json" \
  2>&1 | tee "$out/table.md"
status=${PIPESTATUS[0]}

if "$py" -c 'import pytest' 2>/dev/null; then
  timeout 120 "$py" -m pytest -q -p no:cacheprovider -m cuda tests/core/test_binding_cuda.py 2>&1 | tee "$out/pytest.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || [ "$status" -ne 0 ] || status=1
fi
echo "check.sh: exit $status (0 all measured and right, 1 wrong answer, 2 GPU rows not measured)"
exit "$status"

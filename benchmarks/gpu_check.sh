#!/usr/bin/env bash
# The real executor on an NVIDIA GPU: the torch backend's CUDA tests, then the benchmark's two figures
# (tracing overhead ratio, calibrated cost model error against the GPU's measured steps). About 5 minutes.
#
#   benchmarks/gpu_check.sh [OUT_DIR]      # results in OUT_DIR (default: gpu-results/)
#
# Needs torch with CUDA in .venv (e.g. `.venv/bin/pip install -e ".[torch]"` where a CUDA wheel is the
# default). Paste the printed figures into BENCHMARKS.md, "## Real executor", under "GPU".
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-results}"
mkdir -p "$out"
py=.venv/bin/python

$py - <<'EOF' | tee "$out/device.txt"
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())
EOF
hardware=$($py -c "from infertrace.cli import _cuda_hardware_name; print(_cuda_hardware_name())")
echo "hardware spec: $hardware" | tee -a "$out/device.txt"

# Correctness on CUDA: the same equalities as on the CPU (float32 tolerance), and numpy vs torch-CUDA agreement.
timeout 300 $py -m pytest -q -m gpu tests/test_real_executor_gpu.py 2>&1 | tee "$out/tests.txt"

# The figures: a larger model than `tiny`, so a GPU step is not all launch overhead; bf16 as served.
timeout 900 $py benchmarks/bench_real_executor.py --model small --backend torch --device cuda --dtype bfloat16 \
  --hardware "$hardware" --threads 0 --repetitions 10 --overhead-requests 16 --requests 48 \
  --json "$out/bench_gpu.json" 2>&1 | tee "$out/bench.txt"

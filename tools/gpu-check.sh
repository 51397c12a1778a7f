#!/usr/bin/env bash
# The GPU suite in one command: tests/gpu (the kernels against their CPU twin, half-precision
# update projection, DPZero runs on CUDA replayed on CPU), the zo-step benchmarks and a ZeRO-3
# step with its weights in host memory (DeepSpeed, one process), written to
# OUTPUT_DIR/gpu-check.json and OUTPUT_DIR/gpu-check.md. Without a CUDA device it says so and
# exits 0. On a node without a package index, put the wheels of tools/gpu-wheels.sh in .whl/.
# Usage: tools/gpu-check.sh [--output-dir DIR] [--budget-s SECONDS] [--repeats N] [--parts LIST]
set -euo pipefail
cd "$(dirname "$0")/.."
site=${PRIVZO_GPU_SITE:-/tmp/privzo-gpu-site}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" .whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/platform:$PYTHONPATH" PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
exec python3 tools/gpu_check.py "$@"

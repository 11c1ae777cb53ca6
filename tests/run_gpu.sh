#!/usr/bin/env bash
# Everything CUDA in one call on a machine with an NVIDIA GPU: the op-by-op backend suite (every
# op, forward and gradients, CUDA against the reference interpreter), the model and session
# tests on CUDA, the digits demo with --backend cuda, then the benchmark beside the PyTorch peer.
#   tests/run_gpu.sh [quick]      (binaries from `make`; logs under $OUT or /tmp/tg_gpu)
# Where the machine lacks OpenBLAS, put its shared libraries in .devlibs/ (see bench/RESULTS.md).
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/tg_gpu}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.devlibs:${LD_LIBRARY_PATH:-}"
export TG_CACHE_DIR=/tmp/tg_gpu_cache OMP_WAIT_POLICY=PASSIVE
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
run() { echo "== $*"; "$@" 2>&1 | tee -a "$out/log.txt" | tail -n 25; }
run build/tests/test_backend
run build/tests/test_models
TG_SESSION_BACKENDS=cuda run build/tests/test_session
run build/tests/test_faults   # non-finite gradients on CUDA too: the guarded write-back
run build/examples/digits --backend cuda
[ "${1:-}" = quick ] && exit 0
run build/bench/bench --backend cuda sin_mlp mnist_mlp cifar_cnn char_gpt_small char_gpt
echo "== PyTorch peer"
PYTHONUNBUFFERED=1 python3 bench/peers/torch_workloads.py cuda 2>&1 | grep -v Warning | tee -a "$out/log.txt"

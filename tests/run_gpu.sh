#!/usr/bin/env bash
# Everything CUDA in one call on a machine with an NVIDIA GPU: the op-by-op backend suite (every
# op, forward and gradients, CUDA against the reference interpreter, fused attention included),
# the model, session and fault tests on CUDA, the digits demo with --backend cuda, then the
# benchmark and the PyTorch peer in the same run.
#   tests/run_gpu.sh [tests|bench|peer|bench+peer|all]   (default all; binaries from `make`; logs under $OUT)
#     tests  the CUDA suite at every precision, the training-quality runs (digits CNN and chargpt
#            in f32 and bf16; chargpt reads .devlibs/fortunes.txt.xz where present) and the demo
#     bench  ours: the five workloads at f32, tf32 and bf16, then a per-op profile of the GPT ones
#     peer   PyTorch at each precision, every mode (PEER_MODES=graph,cgraph: those only); --sdpa
#            too for the GPT workloads
# PRECISIONS="f32 bf16" limits bench and peer to those (a whole table in one call of 10 minutes:
# `PRECISIONS=f32 PEER_MODES=graph,cgraph tests/run_gpu.sh bench+peer`).
# The GPU machines lack OpenBLAS: where .devlibs/devlibs.tar.xz holds its shared libraries (from
# a Debian machine: libopenblas.so.0, libgfortran.so.5, libquadmath.so.0), they are used.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/tg_gpu}
what=${1:-all}
mkdir -p "$out" .devlibs/lib
[ -f .devlibs/devlibs.tar.xz ] && tar xJf .devlibs/devlibs.tar.xz -C .devlibs/lib
export LD_LIBRARY_PATH="$PWD/.devlibs/lib:${LD_LIBRARY_PATH:-}"
export TG_CACHE_DIR=/tmp/tg_gpu_cache OMP_WAIT_POLICY=PASSIVE NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
run() { echo "== $*"; "$@" 2>&1 | tee -a "$out/log.txt" | grep -E "FAIL|passed|accuracy|cuda" | tail -n 25; }
# test_backend's CUDA-only pass with the settings given, in three shards at once (TG_TEST_SHARD):
# NVRTC compiles each case on the CPU, which one process leaves mostly idle.
cuda_shards() {
    echo "== test_backend CUDA-only, $*"
    for k in 0 1 2; do env "$@" TG_TEST_SHARD=$k/3 TG_TEST_CUDA_ONLY=1 build/tests/test_backend > "$out/shard_$k.txt" 2>&1 & done
    wait
    cat "$out"/shard_?.txt | tee -a "$out/log.txt" | grep -E "FAIL|passed|cuda" | tail -n 25
}
if [ "$what" = tests ] || [ "$what" = all ]; then
    run build/tests/test_backend
    for l in 1 2 4; do   # each vector-lane path on every shape that allows it (the default picks by size)
        cuda_shards TG_CUDA_LANES=$l
    done
    cuda_shards TG_CUDA_EARLY=0      # kernels launched as usual, not early
    cuda_shards TG_CUDA_ROW_REGS=0   # row kernels with every member in memory
    for w in 4 8 16; do   # every small f32/tf32 product through our kernel (cuda_products.c), each block size
        cuda_shards TG_CUDA_OWN_GEMM=$w
    done
    cuda_shards TG_CUDA_X3=1       # every f32 product it takes as three TF32 products
    cuda_shards TG_CUDA_TRANSPOSED=1   # every tf32 forward product X W from W's transposed copy
    cuda_shards TG_CUDA_INPLACE=0  # every write-back copied at the step's end
    run build/tests/test_attention   # fused attention on CUDA: causal or not, odd T, head sizes, bf16 tensor cores
    run build/tests/test_models
    TG_SESSION_BACKENDS=cuda run build/tests/test_session
    run build/tests/test_faults   # non-finite gradients on CUDA too: the guarded in-place update
    TG_CUDA_INPLACE=0 run build/tests/test_faults   # and the guarded write-back copy
    [ -f .devlibs/fortunes.txt.xz ] && xz -dc .devlibs/fortunes.txt.xz > /tmp/fortunes.txt && export TG_TEST_CORPUS=/tmp/fortunes.txt
    run build/tests/test_precision
    run build/examples/digits --backend cuda
fi
if [ "$what" = bench ] || [ "$what" = bench+peer ] || [ "$what" = all ]; then
    # The first pass compiles on an empty kernel cache (its compile cold= figures) and warms the
    # GPU: the first process on a fresh machine ran the small workloads up to 8% slower than the
    # processes after it (bench/RESULTS.md, thirteenth session). The second pass is the one timed.
    echo "== tensorgrad (empty kernel cache: cold compiles)"
    rm -rf "$TG_CACHE_DIR"
    for pass in cold.txt log.txt; do
        for p in ${PRECISIONS:-f32 tf32 bf16}; do
            build/bench/bench --backend cuda --precision $p sin_mlp mnist_mlp cifar_cnn char_gpt_small char_gpt 2>&1 | tee -a "$out/$pass"
        done
    done
    for p in ${PRECISIONS:-f32 bf16}; do   # launches timed between events: where the time goes
        TG_CUDA_PROFILE=1 build/bench/bench --backend cuda --precision $p --steps-scale 0.2 char_gpt_small char_gpt 2>&1 |
            tee -a "$out/profile.txt" | grep -v "^char_gpt"
    done
fi
if [ "$what" = peer ] || [ "$what" = bench+peer ] || [ "$what" = all ]; then
    export PYTHONUNBUFFERED=1
    for p in ${PRECISIONS:-f32 tf32 bf16}; do
        echo "== PyTorch peer ($p)"
        python3 bench/peers/torch_workloads.py cuda --precision $p ${PEER_MODES:+--modes $PEER_MODES} 2>&1 | grep -v Warning | tee -a "$out/log.txt"
        python3 bench/peers/torch_workloads.py cuda --precision $p --sdpa ${PEER_MODES:+--modes $PEER_MODES} char_gpt_small char_gpt 2>&1 | grep -v Warning | tee -a "$out/log.txt"
    done
    for p in ${PRECISIONS:-f32 tf32 bf16}; do python3 bench/peers/compare.py "$out/log.txt" --precision $p; done | tee "$out/ratios.txt"
fi

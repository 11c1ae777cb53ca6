#!/usr/bin/env bash
# CPU benchmark beside the PyTorch peer, in one run on an otherwise idle machine:
#   apt-get install -y python3-torch libopenblas0-pthread && make all && bench/run_cpu.sh
# PyTorch runs with 1 and with 2 threads (the figure to beat is its better median per workload);
# ours with OMP_NUM_THREADS (default 2), then with 1 thread (parallel efficiency: the 1-thread
# time over twice the 2-thread time), then the product kernel alone (bench/gemm_bench.c). Ours
# runs the kernel path TG_CPU_ISA picks: unset, the best this CPU has; TG_CPU_ISA=avx2 on an
# AVX-512 machine runs what an AVX2-only one runs (the CPU's flags are in the log). PRECISION=bf16
# runs both sides in bf16 (PyTorch: autocast to bfloat16; ours: bf16 products where the CPU has
# AVX512-BF16, else f32, as the bench line's precision= says).
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-active}   # timing on an idle machine: no sleeping threads
workloads="sin_mlp mnist_mlp cifar_cnn char_gpt_small"
prec=${PRECISION:-f32}
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc --all) cores, OMP_NUM_THREADS=$OMP_NUM_THREADS," \
     "OMP_WAIT_POLICY=$OMP_WAIT_POLICY, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== CPU: $(lscpu | sed -n 's/^Model name: *//p'); lscpu vector flags: $(lscpu | sed -n 's/^Flags: *//p' |
     tr ' ' '\n' | grep -E '^(avx|avx2|fma|avx512.*)$' | tr '\n' ' ')"
echo "== TG_CPU_ISA=${TG_CPU_ISA:-(unset: the best path this CPU runs)}, precision $prec"
echo "== PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null), 1 and 2 threads"
for t in 1 2; do
    /usr/bin/python3 bench/peers/torch_workloads.py cpu --precision $prec --threads $t 2>&1 | grep -v -i warn | sed "s/^/threads=$t /"
done
echo "== tensorgrad, $OMP_NUM_THREADS threads (empty kernel cache for the cold compile)"
TG_CACHE_DIR=$(mktemp -d) build/bench/bench --precision $prec $workloads
echo "== tensorgrad, 1 thread"
OMP_NUM_THREADS=1 build/bench/bench --precision $prec $workloads
echo "== the product kernel alone (GFLOP/s against the FMA peak of one core)"
build/bench/gemm_bench 512 1024 2048
# peak resident memory of a PyTorch process per workload (ours is printed by bench)
for w in $workloads; do
    /usr/bin/time -f "$w peak_rss %M KB (PyTorch)" /usr/bin/python3 bench/peers/torch_workloads.py cpu --precision $prec --threads 2 $w > /dev/null
done 2>&1 | grep peak_rss

#!/usr/bin/env bash
# Data-parallel training on a machine with 2 GPUs (the device tool's nvidia-h200-x2), in one call:
# correctness, a rank that dies, and speed beside PyTorch DDP.
#   tests/run_gpu_multi.sh [tests|bench|peer|all]   (default all; binaries from `make`; logs under $OUT)
#     tests  build/tests/test_dist_gpu in one process on GPUs 0 and 1 (char_gpt_small and the
#            digits CNN, 50 steps: losses against one GPU at the same global batch, identical
#            parameters on both GPUs after every step, checkpoints 2 -> 1, 1 -> 2, 2 -> 2); then
#            the same workloads as 2 processes launched like torchrun (our launcher, and torchrun
#            --no_python once): both ranks identical, against one GPU, checkpoints 1 GPU -> 2
#            processes and back; then rank 1 dies at step 10 and rank 0 must fail its step within
#            TG_DIST_TIMEOUT (30 s here) with its parameters unchanged
#     bench  char_gpt at 64 sequences per GPU, f32 and bf16: 1 GPU, 2 GPUs in one process, 2
#            processes; samples/s and the scaling (target: 2 GPUs >= 1.85 x one)
#     peer   PyTorch DDP (bench/peers/torch_ddp.py under torchrun --nproc_per_node 2, fused Adam)
#            and the same script on one GPU, in the same precisions; then the table of ratios
#            (target: ours >= 1.1 x DDP at 2 GPUs)
# TG_DIST_GPU_BACKEND=cpu runs the tests part on the host, without GPUs (to try this script);
# TG_LAUNCHER=ours launches every 2-process run without torchrun.
# The GPU machines lack OpenBLAS: where .devlibs/devlibs.tar.xz holds it, it is used (run_gpu.sh).
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/tg_gpu_multi}
what=${1:-all}
mkdir -p "$out" .devlibs/lib
[ -f .devlibs/devlibs.tar.xz ] && tar xJf .devlibs/devlibs.tar.xz -C .devlibs/lib
export LD_LIBRARY_PATH="$PWD/.devlibs/lib:${LD_LIBRARY_PATH:-}"
export TG_CACHE_DIR=/tmp/tg_gpu_cache OMP_WAIT_POLICY=PASSIVE NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$out/device.txt"
nvidia-smi topo -m > "$out/topology.txt" 2>&1
log="$out/log.txt"
status=0
port=$((29500 + RANDOM % 1000))

# Two processes, as torchrun starts them (TG_ variables; torchrun's own names work as well).
launch2() {
    port=$((port + 1))
    local pids=() rc=0
    for r in 0 1; do
        TG_RANK=$r TG_WORLD_SIZE=2 TG_LOCAL_RANK=$r TG_MASTER_ADDR=127.0.0.1 TG_MASTER_PORT=$port "$@" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}

# The same through torchrun, where it is installed (else, or with TG_LAUNCHER=ours, our launcher).
torchrun2() {
    port=$((port + 1))
    if [ "${TG_LAUNCHER:-torchrun}" = torchrun ] && torchrun --help > /dev/null 2>&1; then
        torchrun --nproc_per_node 2 --master_port $port --no_python "$@"
    else
        echo "(torchrun not found: launching both ranks ourselves)"
        launch2 "$@"
    fi
}

run() {
    echo "== $*" | tee -a "$log"
    "$@" 2>&1 | tee -a "$log" | grep -E "FAIL|passed|skipped|difference|failed after" | tail -n 30
    return "${PIPESTATUS[0]}"
}

if [ "$what" = tests ] || [ "$what" = all ]; then
    t=build/tests/test_dist_gpu
    run $t || status=1
    dir="$out/dist"
    rm -rf "$dir"; mkdir -p "$dir"
    for w in char_gpt_small digits_cnn; do
        run $t --prepare $w "$dir" || status=1
        if [ $w = char_gpt_small ]; then
            echo "== torchrun: $w, 2 processes" | tee -a "$log"
            torchrun2 $t --rank $w "$dir" >> "$log" 2>&1 || status=1
        else
            echo "== 2 processes: $w" | tee -a "$log"
            launch2 $t --rank $w "$dir" >> "$log" 2>&1 || status=1
        fi
        echo "== 2 processes resumed from one GPU's checkpoint: $w" | tee -a "$log"
        launch2 $t --rank $w "$dir" --resume >> "$log" 2>&1 || status=1
        run $t --check $w "$dir" || status=1
    done
    echo "== rank 1 dies at step 10 (TG_DIST_TIMEOUT=30)" | tee -a "$log"
    start=$(date +%s)
    TG_DIST_TIMEOUT=30 launch2 $t --rank digits_cnn "$dir" --die-at 10 >> "$log" 2>&1
    echo "   both ranks gone after $(( $(date +%s) - start )) s" | tee -a "$log"
    TG_DIST_TIMEOUT=30 run $t --check-die digits_cnn "$dir" || status=1
fi

if [ "$what" = bench ] || [ "$what" = all ]; then
    b=build/bench/bench
    for p in f32 bf16; do
        echo "== tensorgrad char_gpt ($p): 1 GPU, 2 GPUs in one process, 2 processes" | tee -a "$log"
        $b --backend cuda --precision $p char_gpt 2>&1 | tee -a "$out/bench.txt" "$log"
        $b --backend cuda --precision $p --devices 0,1 char_gpt 2>&1 | tee -a "$out/bench.txt" "$log"
        torchrun2 $b --backend cuda --precision $p --dist char_gpt 2>&1 | tee -a "$out/bench.txt" "$log"
    done
fi

if [ "$what" = peer ] || [ "$what" = all ]; then
    for p in f32 bf16; do
        echo "== PyTorch DDP char_gpt ($p): 1 GPU, then torchrun --nproc_per_node 2" | tee -a "$log"
        python3 bench/peers/torch_ddp.py --precision $p char_gpt 2>&1 | grep -v Warning | tee -a "$out/bench.txt" "$log"
        port=$((port + 1))
        torchrun --nproc_per_node 2 --master_port $port bench/peers/torch_ddp.py --precision $p char_gpt 2>&1 \
            | grep -v Warning | tee -a "$out/bench.txt" "$log"
    done
fi

if [ -f "$out/bench.txt" ]; then
    # samples/s per (precision, setting): ours at 1 replica, 2 in one process, 2 processes; DDP
    # at 1 and 2; then the two ratios the issue sets targets for.
    awk '
    /^char_gpt / && / tg / {
        p = "?"; for (i = 1; i <= NF; i++) {
            if ($i ~ /^precision=/) p = substr($i, 11); if ($i ~ /^replicas=/) n = substr($i, 10)
            if ($i ~ /^processes=/) q = substr($i, 11); if ($i ~ /^samples\/s=/) s = substr($i, 11)
        }
        k = (n == 1) ? "tg1" : (q == 1 ? "tg2s" : "tg2p"); v[p, k] = s; ps[p] = 1
    }
    /^char_gpt / && / ddp-/ {
        split($3, t, "+"); p = t[1]; for (i = 1; i <= NF; i++) { if ($i ~ /^world=/) n = substr($i, 7); if ($i ~ /^samples\/s=/) s = substr($i, 11) }
        k = "ddp" n; if (!((p, k) in v) || s + 0 > v[p, k] + 0) v[p, k] = s; ps[p] = 1
    }
    END {
        printf "| precision | ours 1 GPU | ours 2 GPUs, 1 process | ours 2 processes | DDP 1 GPU | DDP 2 GPUs | scaling (2 proc / 1) | ours / DDP at 2 |\n"
        printf "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
        for (p in ps) {
            a = v[p, "tg1"]; b = v[p, "tg2s"]; c = v[p, "tg2p"]; d = v[p, "ddp1"]; e = v[p, "ddp2"]
            printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", p, a, b, c, d, e,
                (a > 0 && c > 0) ? sprintf("%.2f", c / a) : "-", (e > 0 && c > 0) ? sprintf("%.2f", c / e) : "-"
        }
    }' "$out/bench.txt" | tee "$out/scaling.txt"
fi
exit $status

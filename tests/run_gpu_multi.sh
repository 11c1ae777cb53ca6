#!/usr/bin/env bash
# Data-parallel training on a machine with several GPUs (the device tool's nvidia-h100-x2 .. -x8),
# in one call: correctness, a rank that dies, and speed beside PyTorch DDP.
#   tests/run_gpu_multi.sh [tests|bench|peer|all|table]   (default all; binaries from `make`; logs under $OUT;
#                                                   table: only the table of $OUT/bench.txt, which may join runs)
#     tests  for each N in $TEST_GPUS (default 2): build/tests/test_dist_gpu in one process on GPUs
#            0..N-1 (char_gpt_small and the digits CNN, 50 steps: losses against one GPU at the
#            same global batch, identical parameters on every GPU after every step, checkpoints
#            N -> 1, 1 -> N, N -> N); then the same workloads as N processes launched like
#            torchrun (our launcher, and torchrun --no_python once): every rank identical, against
#            one GPU, checkpoints 1 GPU -> N processes and back; then (N = 2) rank 1 dies at step 10
#            and rank 0 must fail its step within TG_DIST_TIMEOUT (30 s here) with its parameters
#            unchanged
#     bench  each of $WORKLOADS (default char_gpt; also gpt2_small, GPT-2 small's shape) at each of
#            $PRECISIONS (default "f32 bf16") on N of $COUNTS GPUs (default "1 2"): 1 GPU, N GPUs in
#            one process, N processes; samples/s and the scaling (target: 2 GPUs >= 1.85 x one)
#     peer   PyTorch DDP (bench/peers/torch_ddp.py, modes $PEER_MODES (default eager,compile) with
#            $PEER_FLAGS (default --sdpa), fused Adam) under torchrun --nproc_per_node N, and the
#            same script on one GPU; then the table of ratios (target: ours >= 1.1 x DDP)
# TG_DIST_GPU_BACKEND=cpu runs the tests part on the host, without GPUs (to try this script);
# TG_LAUNCHER=ours launches every multi-process run without torchrun.
# The GPU machines lack OpenBLAS: where .devlibs/devlibs.tar.xz holds it, it is used (run_gpu.sh).
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/tg_gpu_multi}
what=${1:-all}
mkdir -p "$out" .devlibs/lib
[ -f .devlibs/devlibs.tar.xz ] && tar xJf .devlibs/devlibs.tar.xz -C .devlibs/lib
export LD_LIBRARY_PATH="$PWD/.devlibs/lib:${LD_LIBRARY_PATH:-}"
export TG_CACHE_DIR=/tmp/tg_gpu_cache OMP_WAIT_POLICY=PASSIVE NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
if [ "$what" != table ]; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$out/device.txt"
    nvidia-smi topo -m > "$out/topology.txt" 2>&1
fi
log="$out/log.txt"
status=0
port=$((29500 + RANDOM % 1000))

# N processes, as torchrun starts them (TG_ variables; torchrun's own names work as well); each
# killed after LAUNCH_TIMEOUT seconds (300), so that a hang ends the run, not the machine's time.
launch() {
    local n=$1 pids=() rc=0
    shift
    port=$((port + 1))
    for r in $(seq 0 $((n - 1))); do
        TG_RANK=$r TG_WORLD_SIZE=$n TG_LOCAL_RANK=$r TG_MASTER_ADDR=127.0.0.1 TG_MASTER_PORT=$port \
            timeout "${LAUNCH_TIMEOUT:-300}" "$@" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}

# The same through torchrun, where it is installed (else, or with TG_LAUNCHER=ours, our launcher).
torchrun_n() {
    local n=$1
    shift
    port=$((port + 1))
    if [ "${TG_LAUNCHER:-torchrun}" = torchrun ] && torchrun --help > /dev/null 2>&1; then
        torchrun --nproc_per_node "$n" --master_port $port --no_python "$@"
    else
        echo "(torchrun not found: launching the ranks ourselves)"
        launch "$n" "$@"
    fi
}

run() {
    echo "== $*" | tee -a "$log"
    "$@" 2>&1 | tee -a "$log" | grep -E "FAIL|passed|skipped|difference|failed after" | tail -n 30
    return "${PIPESTATUS[0]}"
}

if [ "$what" = tests ] || [ "$what" = all ]; then
    t=build/tests/test_dist_gpu
    for n in ${TEST_GPUS:-2}; do
        export TG_TEST_GPUS=$n
        echo "== $n GPUs" | tee -a "$log"
        run $t || status=1
        dir="$out/dist$n"
        rm -rf "$dir"; mkdir -p "$dir"
        for w in char_gpt_small digits_cnn; do
            run $t --prepare $w "$dir" || status=1
            if [ $w = char_gpt_small ]; then
                echo "== torchrun: $w, $n processes" | tee -a "$log"
                torchrun_n $n $t --rank $w "$dir" >> "$log" 2>&1 || status=1
            else
                echo "== $n processes: $w" | tee -a "$log"
                launch $n $t --rank $w "$dir" >> "$log" 2>&1 || status=1
            fi
            echo "== $n processes resumed from one GPU's checkpoint: $w" | tee -a "$log"
            launch $n $t --rank $w "$dir" --resume >> "$log" 2>&1 || status=1
            run $t --check $w "$dir" || status=1
        done
    done
    export TG_TEST_GPUS=2
    dir="$out/dist2"
    mkdir -p "$dir"
    echo "== rank 1 of 2 dies at step 10 (TG_DIST_TIMEOUT=30)" | tee -a "$log"
    start=$(date +%s)
    TG_DIST_TIMEOUT=30 LAUNCH_TIMEOUT=120 launch 2 $t --rank digits_cnn "$dir" --die-at 10 >> "$log" 2>&1
    echo "   both ranks gone after $(( $(date +%s) - start )) s" | tee -a "$log"
    TG_DIST_TIMEOUT=30 run $t --check-die digits_cnn "$dir" || status=1
fi

if [ "$what" = bench ] || [ "$what" = all ]; then
    b=build/bench/bench
    for w in ${WORKLOADS:-char_gpt}; do
        for p in ${PRECISIONS:-f32 bf16}; do
            # a first process times the products' algorithms and fills the kernel cache (its steps
            # run slower than any later process's: bench/RESULTS.md); every timed run comes after it
            $b --backend cuda --precision $p --steps-scale 0.05 $w > /dev/null 2>&1
            for n in ${COUNTS:-1 2}; do
                echo "== tensorgrad $w ($p) on $n GPUs: one process, then $n processes" | tee -a "$log"
                if [ "$n" = 1 ]; then
                    $b --backend cuda --precision $p $w 2>&1 | tee -a "$out/bench.txt" "$log"
                    continue
                fi
                $b --backend cuda --precision $p --devices "$(seq -s, 0 $((n - 1)))" $w 2>&1 | tee -a "$out/bench.txt" "$log"
                torchrun_n $n $b --backend cuda --precision $p --dist $w 2>&1 | tee -a "$out/bench.txt" "$log"
            done
        done
    done
fi

if [ "$what" = peer ] || [ "$what" = all ]; then
    for w in ${WORKLOADS:-char_gpt}; do
        for p in ${PRECISIONS:-f32 bf16}; do
            for n in ${COUNTS:-1 2}; do
                echo "== PyTorch DDP $w ($p) on $n GPUs" | tee -a "$log"
                args=(--precision $p --modes "${PEER_MODES:-eager,compile}" ${PEER_FLAGS---sdpa} $w)
                port=$((port + 1))
                if [ "$n" = 1 ]; then
                    python3 bench/peers/torch_ddp.py "${args[@]}"
                else
                    torchrun --nproc_per_node $n --master_port $port bench/peers/torch_ddp.py "${args[@]}"
                fi 2>&1 | grep -v Warning | tee -a "$out/bench.txt" "$log"
            done
        done
    done
fi

if [ -f "$out/bench.txt" ]; then
    # samples/s per (workload, precision, GPUs): ours in one process and in N processes, DDP's
    # best mode; the scaling (N GPUs / (N x one GPU)) and the ratio to DDP the issues set targets for.
    awk '
    / tg / && /samples\/s=/ {
        for (i = 1; i <= NF; i++) {
            if ($i ~ /^precision=/) p = substr($i, 11); if ($i ~ /^replicas=/) n = substr($i, 10)
            if ($i ~ /^processes=/) q = substr($i, 11); if ($i ~ /^samples\/s=/) s = substr($i, 11)
        }
        k = $1 SUBSEP p SUBSEP n; keys[k] = 1
        if (n == 1 || q == 1) one[k] = s; else proc[k] = s
    }
    / ddp-/ && /samples\/s=/ {
        split($3, t, "+"); p = t[1]
        for (i = 1; i <= NF; i++) { if ($i ~ /^world=/) n = substr($i, 7); if ($i ~ /^samples\/s=/) s = substr($i, 11) }
        k = $1 SUBSEP p SUBSEP n; keys[k] = 1
        if (!(k in ddp) || s + 0 > ddp[k] + 0) ddp[k] = s
    }
    END {
        printf "| workload | precision | GPUs | ours, 1 process | ours, N processes | DDP (best mode) | ours scaling | DDP scaling | ours / DDP |\n"
        printf "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
        for (k in keys) {
            split(k, f, SUBSEP); b = f[1] SUBSEP f[2] SUBSEP 1
            best = (proc[k] + 0 > one[k] + 0) ? proc[k] : one[k]
            printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", f[1], f[2], f[3], one[k], (f[3] == 1) ? "-" : proc[k], ddp[k],
                (f[3] > 1 && one[b] > 0 && best > 0) ? sprintf("%.2f", best / (f[3] * one[b])) : "-",
                (f[3] > 1 && ddp[b] > 0 && ddp[k] > 0) ? sprintf("%.2f", ddp[k] / (f[3] * ddp[b])) : "-",
                (ddp[k] > 0 && best > 0) ? sprintf("%.2f", best / ddp[k]) : "-"
        }
    }' "$out/bench.txt" | (read -r h1; read -r h2; echo "$h1"; echo "$h2"; sort) | tee "$out/scaling.txt"
fi
exit $status

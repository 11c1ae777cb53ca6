#!/usr/bin/env bash
# CPU benchmark beside the PyTorch peer, in one run on an otherwise idle machine:
#   apt-get install -y python3-torch libopenblas0-pthread && make all && bench/run_cpu.sh
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
echo "== $(nproc --all) cores, OMP_NUM_THREADS=$OMP_NUM_THREADS, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
/usr/bin/python3 bench/peers/torch_workloads.py cpu 2>&1 | grep -v -i warn
echo "== tensorgrad (empty kernel cache for the cold compile)"
TG_CACHE_DIR=$(mktemp -d) build/bench/bench sin_mlp mnist_mlp cifar_cnn char_gpt_small
# peak resident memory of a PyTorch process per workload (ours is printed by bench)
for w in sin_mlp mnist_mlp cifar_cnn char_gpt_small; do
    /usr/bin/time -f "$w peak_rss %M KB (PyTorch)" /usr/bin/python3 bench/peers/torch_workloads.py cpu $w > /dev/null
done 2>&1 | grep peak_rss

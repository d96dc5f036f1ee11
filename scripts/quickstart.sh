#!/usr/bin/env bash
# The main job on a fresh machine: install dependencies, build, prepare char-level
# tinyshakespeare, train the default config and print samples from the trained model.
# On a machine with a GPU and the CUDA model backend this trains configs/shakespeare_char.json;
# on the CPU it trains configs/tiny_cpu.json (a few minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
make -j"$(nproc)" train_gpt
bash scripts/prepare_shakespeare.sh char
config=configs/tiny_cpu.json
device=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && ./train_gpt train --help 2>/dev/null | grep -q "cuda backend: available"; then
    config=configs/shakespeare_char.json
    device=cuda
fi
echo "training $config on $device"
./train_gpt train -c "$config" --device "$device" "$@"
dir=$(sed -n 's/.*"dir": *"\([^"]*\)".*/\1/p' "$config" | head -1)
ckpt=$(ls -d "$dir"/ckpt_* | sort | tail -1)
echo
echo "samples from $ckpt:"
for seed in 1 2; do
    ./train_gpt sample --checkpoint "$ckpt" --device "$device" --tokens 300 --temperature 0.8 --top-k 40 --seed "$seed"
    echo "--------"
done

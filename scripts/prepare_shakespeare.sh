#!/usr/bin/env bash
# Prepares tinyshakespeare as token shards in data_cache/shakespeare_<tokenizer>/ (default: char).
# The text comes from ../shared/data/tinyshakespeare.txt when present, otherwise it is downloaded
# from its public source (Karpathy's char-rnn repository).
#   usage: scripts/prepare_shakespeare.sh [char|byte|gpt2]
set -euo pipefail
cd "$(dirname "$0")/.."
tok=${1:-char}
out=data_cache/shakespeare_$tok
text=""
for cand in ../shared/data/tinyshakespeare.txt data_cache/tinyshakespeare.txt; do
    [ -f "$cand" ] && { text=$cand; break; }
done
if [ -z "$text" ]; then
    mkdir -p data_cache
    url=https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
    echo "downloading tinyshakespeare from $url"
    curl -fsSL "$url" -o data_cache/tinyshakespeare.txt.part && mv data_cache/tinyshakespeare.txt.part data_cache/tinyshakespeare.txt
    text=data_cache/tinyshakespeare.txt
fi
if [ -f "$out/shakespeare_${tok}_train.bin" ] && [ -f "$out/shakespeare_${tok}_tokenizer.bin" ]; then
    echo "prepare: $out already prepared"
    exit 0
fi
./train_gpt prepare --tokenizer "$tok" --input "$text" --out "$out/shakespeare_$tok"

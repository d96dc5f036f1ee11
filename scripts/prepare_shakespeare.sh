#!/usr/bin/env bash
# Prepares tinyshakespeare as token shards in data_cache/shakespeare_<tokenizer>/ (default: char).
# The text (and GPT-2's files) come through scripts/fetch_data.sh: from a local copy when it finds
# one, otherwise downloaded from their public sources.
#   usage: scripts/prepare_shakespeare.sh [char|byte|gpt2]
set -euo pipefail
cd "$(dirname "$0")/.."
tok=${1:-char}
out=data_cache/shakespeare_$tok
bash scripts/fetch_data.sh
text=data_cache/tinyshakespeare.txt
if [ -f "$out/shakespeare_${tok}_train.bin" ] && [ -f "$out/shakespeare_${tok}_tokenizer.bin" ]; then
    echo "prepare: $out already prepared"
    exit 0
fi
./train_gpt prepare --tokenizer "$tok" --input "$text" --out "$out/shakespeare_$tok"

#!/usr/bin/env bash
# Makes the data that the default runs and the tests read available in data_cache/ (ignored by
# git): tinyshakespeare.txt and GPT-2's encoder.json and vocab.bpe. Each file is linked from
# ../shared/data/ (beside this checkout, or beside the local repository it was cloned from) when
# that folder has it, else downloaded once from its public source.
#   usage: scripts/fetch_data.sh
set -euo pipefail
cd "$(dirname "$0")/.."
GPT2_URL=https://openaipublic.blob.core.windows.net/gpt-2/encodings/main
SHAKESPEARE_URL=https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt

fetch() {  # DEST SHARED_COPY URL
    local dest=$1 shared=$2 url=$3
    [ -s "$dest" ] && return 0
    mkdir -p "$(dirname "$dest")"
    if [ -s "$shared" ]; then
        ln -sfn "$(cd "$(dirname "$shared")" && pwd)/$(basename "$shared")" "$dest"
        return 0
    fi
    echo "fetch_data: downloading $url"
    if ! curl -fsSL "$url" -o "$dest.part"; then
        rm -f "$dest.part"
        echo "fetch_data: cannot download $url: put the file at $dest (or in $shared)" >&2
        exit 1
    fi
    mv "$dest.part" "$dest"
}

# The shared data folder: ../shared/data beside this checkout, or, in a clone of a local
# checkout (git clone /path/to/repo), ../shared/data beside the repository it was cloned from.
shared=../shared/data
origin=$(git remote get-url origin 2>/dev/null || true)
if [ ! -d "$shared" ] && [ -n "$origin" ] && [ -d "$origin/../shared/data" ]; then
    shared="$origin/../shared/data"
fi
fetch data_cache/tinyshakespeare.txt "$shared/tinyshakespeare.txt" "$SHAKESPEARE_URL"
for f in encoder.json vocab.bpe; do
    fetch "data_cache/gpt2/$f" "$shared/gpt2/$f" "$GPT2_URL/$f"
done

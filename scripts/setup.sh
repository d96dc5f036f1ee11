#!/usr/bin/env bash
# Installs what flashgpt needs on a Debian/Ubuntu machine (as root, or with sudo): compilers,
# cJSON, OpenBLAS, PCRE2, zlib and zstd (prepare's compressed inputs), OpenMPI, OpenSSL's
# libcrypto, and for the tests Debian's python3 with torch, numpy, pytest, matplotlib, plus
# tiktoken from PyPI. Idempotent: installs only what is missing.
set -euo pipefail
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
PKGS=(build-essential libcjson-dev libopenblas-dev libpcre2-dev zlib1g-dev libzstd-dev openmpi-bin
      libopenmpi-dev libssl-dev python3 python3-numpy python3-torch python3-pytest python3-matplotlib
      python3-pip)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! /usr/bin/python3 -c "import tiktoken" 2>/dev/null; then
    echo "setup: installing tiktoken for /usr/bin/python3"
    $SUDO /usr/bin/python3 -m pip install -q --break-system-packages tiktoken
fi
echo "setup: done"

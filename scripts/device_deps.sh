#!/usr/bin/env bash
# Builds .deps/ (ignored by git): the headers and shared libraries that a GPU machine without a
# package registry lacks (cJSON, PCRE2 headers, OpenBLAS, zlib and zstd, OpenSSL's headers and
# libcrypto), small enough to travel with a run (about 50 MB). Run it here, carry .deps, and on
# the GPU machine build and test with
#   source scripts/device_env.sh && make -j16 test-gpu
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The packages' files unpacked under $tmp (apt-get download needs no root; the index is updated
# only when a package is not found in it).
pkgs=(libcjson1 libcjson-dev libpcre2-dev libpcre2-8-0 libopenblas0-pthread libopenblas-pthread-dev
      libopenblas-dev libgfortran5 libssl-dev libssl3 zlib1g zlib1g-dev libzstd1 libzstd-dev)
mkdir "$tmp/debs"
(cd "$tmp/debs" && apt-get download "${pkgs[@]}" >/dev/null 2>&1) ||
    { apt-get update >/dev/null && (cd "$tmp/debs" && apt-get download "${pkgs[@]}" >/dev/null); }
for deb in "$tmp"/debs/*.deb; do dpkg -x "$deb" "$tmp"; done
rm -rf .deps
mkdir -p .deps/include .deps/lib
src=$tmp/usr
cp -r "$src/include/cjson" "$src/include/pcre2.h" "$src"/include/{zlib.h,zconf.h,zstd.h,zstd_errors.h} .deps/include/
mkdir -p .deps/include/openblas
cp "$src"/include/x86_64-linux-gnu/openblas-pthread/{cblas.h,openblas_config.h,f77blas.h} .deps/include/openblas/
lib=$src/lib/x86_64-linux-gnu
cp -P "$lib"/libcjson.so* "$lib"/libpcre2-8.so* "$lib"/libgfortran.so.5* "$lib"/libzstd.so* .deps/lib/
cp -L "$tmp/lib/x86_64-linux-gnu/libz.so.1" .deps/lib/libz.so.1   # zlib1g installs under /lib
ln -sf libz.so.1 .deps/lib/libz.so
cp -L "$lib/openblas-pthread/libopenblas.so.0" .deps/lib/libopenblas.so.0
ln -sf libopenblas.so.0 .deps/lib/libopenblas.so
# OpenSSL: its headers (the architecture's configuration.h beside the others) and a libcrypto
# kept apart, which scripts/device_env.sh links only when the machine has no libcrypto.so.3.
cp -r "$src/include/openssl" .deps/include/
cp "$src"/include/x86_64-linux-gnu/openssl/*.h .deps/include/openssl/
mkdir -p .deps/crypto
cp -L "$lib/libcrypto.so.3" .deps/crypto/
# NCCL's header, for a GPU machine whose NCCL library came with PyTorch (scripts/device_env.sh).
cuda_home=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
[ -f "$cuda_home/include/nccl.h" ] && cp "$cuda_home/include/nccl.h" .deps/include/
echo "built .deps ($(du -sh .deps | cut -f1))"

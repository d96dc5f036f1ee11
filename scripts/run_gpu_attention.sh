#!/usr/bin/env bash
# Device batch for the attention kernels (one `run` call of the device tool does all of it):
#   scripts/run_gpu_attention.sh [test] [sanitize] [bench] [bench-quick]
# test: build/tests/gpu/test_attention_gpu (built where it runs if it was not carried);
# sanitize: compute-sanitizer memcheck and racecheck on its --quick subset;
# bench: scripts/bench_attention.py (the full table; bench-quick: two sequence lengths).
# Logs go to $OUT (or /tmp/attn_out); a short summary is printed last.
set -u
export NCCL_NVLS_ENABLE=0
out=${OUT:-/tmp/attn_out}
mkdir -p "$out"
bin=build/tests/gpu/test_attention_gpu
summary=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
if ! [ -x "$bin" ] || ! [ -f build/libattention.so ]; then
    make -j16 "$bin" libattention CUDA_ARCH="-gencode=arch=compute_90a,code=sm_90a" >"$out/build.log" 2>&1 \
        || { tail -30 "$out/build.log"; exit 1; }
fi
for step in "$@"; do
    case $step in
    test)
        timeout 300 "$bin" >"$out/test.log" 2>&1
        summary+=("test: rc=$? $(tail -1 "$out/test.log")")
        grep -E "^(FAIL|ok)|^  " "$out/test.log" | grep -v "^ok" | head -60
        ;;
    sanitize)
        for tool in memcheck racecheck; do
            timeout 200 compute-sanitizer --tool $tool --error-exitcode 3 "$bin" --quick >"$out/$tool.log" 2>&1
            summary+=("$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tail -1)")
        done
        ;;
    bench | bench-quick)
        q=""; [ "$step" = bench-quick ] && q="--quick"
        PYTHONUNBUFFERED=1 timeout 400 python3 scripts/bench_attention.py $q --json "$out/bench.json" \
            >"$out/bench.log" 2>&1
        summary+=("bench: rc=$?")
        sed -n '/^correctness vs/,$p' "$out/bench.log"
        ;;
    esac
done
printf '%s\n' "${summary[@]}"

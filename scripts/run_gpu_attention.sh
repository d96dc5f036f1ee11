#!/usr/bin/env bash
# The attention kernels' GPU checks in one command, on a machine with a Hopper GPU:
#   [LOGS=DIR] scripts/run_gpu_attention.sh [test] [sanitize] [bench] [bench-quick]
# test: build/tests/gpu/test_attention_gpu (built first, for sm_90a, if it is missing);
# sanitize: compute-sanitizer memcheck and racecheck on its --quick subset;
# bench: scripts/bench_attention.py (the full table; bench-quick: two sequence lengths).
# Each step's log goes to LOGS (default build/gpu_attention_logs); a short summary is printed last.
# docs/PERFORMANCE.md ("Attention kernels") has the method and the current numbers.
set -u
export NCCL_NVLS_ENABLE=0
logs=${LOGS:-build/gpu_attention_logs}
mkdir -p "$logs"
bin=build/tests/gpu/test_attention_gpu
summary=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$logs/gpu.txt"
if ! [ -x "$bin" ] || ! [ -f build/libattention.so ]; then
    make -j16 "$bin" libattention CUDA_ARCH="-gencode=arch=compute_90a,code=sm_90a" >"$logs/build.log" 2>&1 \
        || { tail -30 "$logs/build.log"; exit 1; }
fi
for step in "$@"; do
    case $step in
    test)
        timeout 300 "$bin" >"$logs/test.log" 2>&1
        summary+=("test: rc=$? $(tail -1 "$logs/test.log")")
        grep -E "^(FAIL|ok)|^  " "$logs/test.log" | grep -v "^ok" | head -60
        ;;
    sanitize)
        for tool in memcheck racecheck; do
            timeout 200 compute-sanitizer --tool $tool --error-exitcode 3 "$bin" --quick >"$logs/$tool.log" 2>&1
            summary+=("$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/$tool.log" | tail -1)")
        done
        ;;
    bench | bench-quick)
        q=""; [ "$step" = bench-quick ] && q="--quick"
        PYTHONUNBUFFERED=1 timeout 400 python3 scripts/bench_attention.py $q --json "$logs/bench.json" \
            >"$logs/bench.log" 2>&1
        summary+=("bench: rc=$?")
        sed -n '/^correctness vs/,$p' "$logs/bench.log"
        ;;
    esac
done
printf '%s\n' "${summary[@]}"

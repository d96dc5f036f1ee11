#!/usr/bin/env bash
# compute-sanitizer over the GPU tests' quick subsets: memcheck (out-of-bounds and misaligned
# accesses, leaks of device memory), racecheck (shared-memory hazards between threads of a
# block), synccheck (barriers and warp syncs used wrongly) and initcheck (device memory read
# before it was written), each tool on each test. A run passes when the tool reports no error
# (exit code 0; --error-exitcode 3 otherwise) and the test's own checks pass.
#   usage: scripts/gpu_sanitize.sh BUILD TEST_BINARY ...   (make test-gpu-sanitize)
# Logs: BUILD/gpu_sanitize/<test>.<tool>.log. SANITIZE_TIMEOUT bounds each run (s, default 600);
# SANITIZE_TOOLS picks the tools. The last line is "N passed, N failed" (one per test and tool).
set -u
cd "$(dirname "$0")/.."
build=$1
shift
cs=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
if [ ! -x "$cs" ]; then
    echo "gpu_sanitize: compute-sanitizer not found (set COMPUTE_SANITIZER)"
    echo "0 passed, 1 failed"
    exit 1
fi
logs=$build/gpu_sanitize
mkdir -p "$logs"
export NCCL_NVLS_ENABLE=0
tools=${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}
passed=0 failed=0
for bin in "$@"; do
    name=$(basename "$bin")
    args=--quick   # every GPU test but the wgmma unit test has a quick subset for this
    [ "$name" = test_wgmma ] && args=
    for tool in $tools; do
        extra=()
        [ "$tool" = memcheck ] && extra=(--leak-check full)
        log=$logs/$name.$tool.log
        start=$SECONDS
        timeout "${SANITIZE_TIMEOUT:-600}" "$cs" --tool "$tool" "${extra[@]}" --error-exitcode 3 \
            "$bin" $args >"$log" 2>&1
        rc=$?
        summary=$(grep -E "(ERROR|RACECHECK|SYNCCHECK|INITCHECK) SUMMARY" "$log" | tail -1)
        tests=$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$log" | tail -1)
        if [ $rc -eq 0 ] && grep -Eq "^[0-9]+ passed, 0 failed" "$log"; then
            passed=$((passed + 1)); status="ok  "
        else
            failed=$((failed + 1)); status=FAIL
        fi
        echo "$status $name $tool: rc=$rc, $((SECONDS - start)) s, ${summary:-no summary}; test: ${tests:-none}"
        [ "$status" = FAIL ] && grep -E "^=========  (Invalid|Race|Barrier|Uninitialized|Program hit)" "$log" | sort | uniq -c | head -5
    done
done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

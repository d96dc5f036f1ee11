#!/usr/bin/env bash
# Bounded fuzzing: each harness in BUILD (make fuzz) runs for SECONDS from its seed corpus
# tests/fuzz/corpus/<name>/, after replaying its crash regressions tests/fuzz/regress/<name>/.
# New inputs go to BUILD/findings/<name>/corpus (the seed folders stay as committed), a crash to
# BUILD/findings/<name>/crash-*; each harness's log is BUILD/findings/<name>.log. Two harnesses
# run at a time (JOBS). The last line is "N passed, N failed" (one per harness).
#   usage: tests/fuzz/run.sh BUILD SECONDS [NAME ...]
set -u
cd "$(dirname "$0")/../.."
build=$1 seconds=$2
shift 2
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for f in tests/fuzz/fuzz_*.c; do n=${f#tests/fuzz/fuzz_}; names+=("${n%.c}"); done
fi
out=$build/findings
mkdir -p "$out"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
one() {   # NAME: regressions, then the bounded run; its status in out/NAME.rc
    local n=$1 bin=$build/fuzz_$1 log=$out/$1.log rc=0
    mkdir -p "$out/$n/corpus"
    : >"$log"
    if [ -d "tests/fuzz/regress/$n" ] && [ -n "$(ls -A "tests/fuzz/regress/$n")" ]; then
        "$bin" -runs=0 "tests/fuzz/regress/$n" >>"$log" 2>&1 || rc=1
    fi
    if [ $rc -eq 0 ]; then
        # -rss_limit_mb: a parser that believes a header and allocates gigabytes is a finding.
        "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
            -print_final_stats=1 -artifact_prefix="$out/$n/" "$out/$n/corpus" "tests/fuzz/corpus/$n" \
            >>"$log" 2>&1 || rc=1
    fi
    echo $rc >"$out/$n.rc"
}
JOBS=${JOBS:-2}
for n in "${names[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 0.2; done
    one "$n" &
done
wait
passed=0 failed=0
for n in "${names[@]}"; do
    log=$out/$n.log
    execs=$(grep -Eo 'stat::number_of_executed_units: [0-9]+' "$log" | grep -Eo '[0-9]+$' || echo 0)
    cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+' || echo 0)
    if [ "$(cat "$out/$n.rc" 2>/dev/null)" = 0 ]; then
        passed=$((passed + 1)); echo "ok   fuzz $n: $execs runs, coverage $cov edges"
    else
        failed=$((failed + 1)); echo "FAIL fuzz $n (log $log):"; grep -E "ERROR|SUMMARY|broken promise|^artifact|Test unit written" "$log" | head -8
    fi
done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

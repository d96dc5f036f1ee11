#!/usr/bin/env bash
# Runs the test programs given as arguments (C binaries, and .py files run by $PYTHON), then
# (without --gpu) the Python tests (all of tests/ but tests/gpu, or the files in PYTEST_ARGS), and
# prints the total as "N passed, N failed" on the last line.
set -u
cd "$(dirname "$0")/.."
gpu=0
if [ "${1:-}" = "--gpu" ]; then gpu=1; shift; fi
PYTHON=${PYTHON:-/usr/bin/python3}
passed=0; failed=0
add_counts() {  # reads "N passed, M failed" (pytest or testlib style) from a log file
    local p f
    p=$(grep -Eo '[0-9]+ passed' "$1" | tail -1 | grep -Eo '[0-9]+' || true)
    f=$(grep -Eo '[0-9]+ failed' "$1" | tail -1 | grep -Eo '[0-9]+' || true)
    e=$(grep -Eo '[0-9]+ errors?( |$)' "$1" | tail -1 | grep -Eo '[0-9]+' || true)  # pytest collection errors
    passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0} + ${e:-0}))
    if [ -z "$p" ] && [ -z "$f" ]; then failed=$((failed + 1)); echo "FAIL $2: no test summary"; fi
}
log=$(mktemp)
if [ $gpu -eq 0 ]; then   # first: the GPT-2 fuzz harness's replay reads these files too
    echo "== data (scripts/fetch_data.sh)"
    bash scripts/fetch_data.sh || { failed=$((failed + 1)); echo "FAIL the tests' data files are missing"; }
fi
for t in "$@"; do
    echo "== $t"
    case $t in
        *.py) "$PYTHON" "$t" >"$log" 2>&1 ;;
        *) "$t" >"$log" 2>&1 ;;
    esac
    rc=$?
    cat "$log"
    add_counts "$log" "$t"
    if [ $rc -ne 0 ] && ! grep -Eq '[1-9][0-9]* failed' "$log"; then
        failed=$((failed + 1)); echo "FAIL $t exited with $rc"
    fi
done
if [ $gpu -eq 0 ]; then
    echo "== pytest ${PYTEST_ARGS:-tests/}"
    # shellcheck disable=SC2086  # PYTEST_ARGS is a list of files
    "$PYTHON" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:---ignore=tests/gpu tests} 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    add_counts "$log" pytest
    if [ "$rc" -ne 0 ] && ! grep -Eq '[1-9][0-9]* (failed|errors?)' "$log"; then
        failed=$((failed + 1)); echo "FAIL pytest exited with $rc"
    fi
fi
rm -f "$log"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

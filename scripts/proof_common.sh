# Shared by the long-context proof scripts (long_copy_proof.sh, long_retrieval_proof.sh), sourced
# from the repository root: their arguments and the record of each training stage.

proof_usage() { echo "usage: $0 [SEQ [WINDOW]] [-- train_gpt options]" >&2; exit 2; }

# proof_args DEFAULT_SEQ WINDOW_DIVISOR [SEQ [WINDOW]] [-- train_gpt options]: sets SEQ, WIN
# (default SEQ / WINDOW_DIVISOR) and PROOF_REST (the train_gpt options); anything but a number
# for SEQ or WINDOW exits 2 with the usage line.
proof_args() {
    local def=$1 div=$2; shift 2
    SEQ=${1:-$def}
    [ $# -gt 0 ] && shift
    WIN=
    if [ $# -gt 0 ] && [ "$1" != "--" ]; then WIN=$1; shift; fi
    [ "${1:-}" = "--" ] && shift
    case "$SEQ" in ''|*[!0-9]*) proof_usage ;; esac
    case "$WIN" in *[!0-9]*) proof_usage ;; esac
    [ -n "$WIN" ] || WIN=$((SEQ / div))
    PROOF_REST=("$@")
}

# last_eval DIR: "STEP VAL" of the newest evaluation in DIR/metrics.jsonl
last_eval() {
    grep '"event":"eval"' "$1/metrics.jsonl" | tail -1 |
        sed -E 's/.*"step":([0-9]+).*"val_loss":([-+0-9.eE]+).*/\1 \2/'
}

PROOF_T0=$(date +%s)
# mark DIR STAGE: print the stage's end (its newest evaluation) and append it to DIR/stages.tsv
# as STAGE, step, val loss, seconds since the script started
mark() {
    local s v; read -r s v < <(last_eval "$1")
    printf '%s\t%s\t%.4f\t%s\n' "$2" "$s" "$v" $(($(date +%s) - PROOF_T0)) >> "$1/stages.tsv"
    printf '== %s: %s ends at step %s, val %.4f, %s s\n' "$1" "$2" "$s" "$v" $(($(date +%s) - PROOF_T0))
}

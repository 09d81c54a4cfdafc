#!/usr/bin/env bash
# Message rate of `mlx5-perf write_bw` (two cabled device-model functions in
# one process) as the number of QPs grows: one markdown table, one row per
# QP count and message size, the figure in millions of messages per second.
#
#   scripts/bench-qp-scale.sh [-D SECONDS] [-q "1 16 ..."] [-s "64 4096"]
#                             [-b BASELINE_BIN] [-r ROUNDS] [BIN]
#
# BIN defaults to target/release/mlx5-perf (built first when absent).
# With -b, every point is run with BASELINE_BIN and then with BIN, one after
# the other (interleaved, so machine load falls on both alike), and the
# table gets a column for each and their ratio. -r runs every point ROUNDS
# times (interleaved likewise) and reports the median. The load average
# before and after is printed: on a shared machine, state it with the table.
set -euo pipefail

cd "$(dirname "$0")/.."
DUR=2
QPS="1 16 64 256 1024 4096"
SIZES="64 4096"
BASE=""
ROUNDS=1
while getopts "D:q:s:b:r:" o; do
    case $o in
    D) DUR=$OPTARG ;;
    q) QPS=$OPTARG ;;
    s) SIZES=$OPTARG ;;
    b) BASE=$OPTARG ;;
    r) ROUNDS=$OPTARG ;;
    *) sed -n '2,14p' "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
BIN=${1:-target/release/mlx5-perf}
if [ ! -x "$BIN" ]; then
    cargo build --release --bin mlx5-perf >&2
fi

# One run: prints the message rate (the last column of perftest's row).
rate() {
    local bin=$1 q=$2 s=$3 out
    if ! out=$("$bin" write_bw -q "$q" -s "$s" -D "$DUR" 2>&1); then
        echo "FAILED"
        printf '%s\n' "$out" | tail -3 >&2
        return
    fi
    printf '%s\n' "$out" | awk -v s="$s" '$1 == s && NF >= 5 { r = $NF } END { print (r == "" ? "FAILED" : r) }'
}

median() {
    tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : "FAILED") }'
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs, -D $DUR, $ROUNDS round(s)"
if [ -n "$BASE" ]; then
    echo "| QPs | size | baseline (M msg/s) | this (M msg/s) | this / baseline |"
    echo "|---:|---:|---:|---:|---:|"
else
    echo "| QPs | size | M msg/s |"
    echo "|---:|---:|---:|"
fi
for s in $SIZES; do
    for q in $QPS; do
        a="" b=""
        for _ in $(seq "$ROUNDS"); do
            [ -n "$BASE" ] && a="$a $(rate "$BASE" "$q" "$s")"
            b="$b $(rate "$BIN" "$q" "$s")"
        done
        mb=$(echo "$b" | median)
        if [ -n "$BASE" ]; then
            ma=$(echo "$a" | median)
            ratio=$(awk -v a="$ma" -v b="$mb" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", b / a; else print "-" }')
            echo "| $q | $s | $ma | $mb | $ratio |"
        else
            echo "| $q | $s | $mb |"
        fi
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

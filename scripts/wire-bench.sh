#!/usr/bin/env bash
# The wire bench (issue 25): mlx5-perf write_bw at 64 B (message rate) and
# 64 KiB (bandwidth), in one run, over
#   - the in-process cable (both sides in one mlx5-perf, two cabled
#     functions of one model),
#   - two processes over the stream wire (two `mlx5-emu serve` joined by a
#     Unix stream socket, the mlx5-perf server and client in two more
#     processes, each on its own model over vfio-user),
#   - the same over the datagram wire (UDP on loopback),
# and the ratios of the wires to the cable. Release build (WIRE_BENCH_DEBUG=1:
# the debug build, to check the script quickly). Usage:
#   scripts/wire-bench.sh [ITERS_64B] [ITERS_64K]
set -euo pipefail
cd "$(dirname "$0")/.."
n64=${1:-20000}
n64k=${2:-2000}
if [ "${WIRE_BENCH_DEBUG:-0}" = 1 ]; then
    cargo build -q -p tools --bin mlx5-emu --bin mlx5-perf
    bin=target/debug
else
    cargo build --release -q -p tools --bin mlx5-emu --bin mlx5-perf
    bin=target/release
fi
dir=$(mktemp -d /tmp/wire-bench.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

# The result row's average MiB/s and Mpps.
row() { awk -v s="$1" '$1 == s && NF >= 5 { print $4, $5 }'; }

port=$((20000 + RANDOM % 20000))
# Two served models wired by $1 (server end) and $2 (client end).
serve_pair() {
    "$bin/mlx5-emu" serve --socket "$dir/a.sock" --wire "$1" 2>"$dir/a.log" &
    pids+=($!)
    "$bin/mlx5-emu" serve --socket "$dir/b.sock" --mac 24:8a:07:b0:00:01 --wire "$2" 2>"$dir/b.log" &
    pids+=($!)
    for s in a b; do
        until grep -q "mlx5-emu: serving" "$dir/$s.log"; do sleep 0.1; done
    done
}
stop_pair() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    pids=()
}
# mlx5-perf write_bw SIZE ITERS across the pair: the client's row.
across() {
    port=$((port + 1))
    "$bin/mlx5-perf" write_bw -s "$1" -n "$2" -p "$port" -d "vfio-user:$dir/a.sock" \
        >"$dir/srv.out" 2>&1 &
    local srv=$!
    "$bin/mlx5-perf" write_bw -s "$1" -n "$2" -p "$port" -d "vfio-user:$dir/b.sock" 127.0.0.1 \
        | row "$1"
    wait "$srv"
}

declare -A r
r[cable,64]=$("$bin/mlx5-perf" write_bw -s 64 -n "$n64" | row 64)
r[cable,65536]=$("$bin/mlx5-perf" write_bw -s 65536 -n "$n64k" | row 65536)

serve_pair "stream,server=on,addr=$dir/w.sock" "stream,addr=$dir/w.sock"
r[stream,64]=$(across 64 "$n64")
r[stream,65536]=$(across 65536 "$n64k")
stop_pair

u1=$((port + 100)); u2=$((port + 101))
serve_pair "dgram,local=127.0.0.1:$u1,remote=127.0.0.1:$u2" \
    "dgram,local=127.0.0.1:$u2,remote=127.0.0.1:$u1"
r[dgram,64]=$(across 64 "$n64")
r[dgram,65536]=$(across 65536 "$n64k")
stop_pair

printf '%-8s %14s %14s %16s %14s\n' wire "64B Mmsg/s" "vs cable" "64KiB MiB/s" "vs cable"
for w in cable stream dgram; do
    read -r _ m64 <<<"${r[$w,64]}"
    read -r bw _ <<<"${r[$w,65536]}"
    read -r _ c64 <<<"${r[cable,64]}"
    read -r cbw _ <<<"${r[cable,65536]}"
    printf '%-8s %14s %14s %16s %14s\n' "$w" "$m64" \
        "$(awk -v a="$m64" -v b="$c64" 'BEGIN { printf "%.4f", a / b }')" "$bw" \
        "$(awk -v a="$bw" -v b="$cbw" 'BEGIN { printf "%.4f", a / b }')"
done

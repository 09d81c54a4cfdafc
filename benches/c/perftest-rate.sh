#!/usr/bin/env bash
# perftest's message rate through this repo's libibverbs.so.1 (ibverbs-c)
# against mlx5-perf, the driver's own perftest, on the same model: one
# `mlx5-emu serve --functions 2` (two cabled functions over vfio-user),
# server on function 0 and client on function 1 as two processes each.
#
#   benches/c/perftest-rate.sh [ITERS] [SIZE]     (defaults 20000, 64)
#
# Release builds (the library under the bench profile, as benches/c_abi).
# Prints each tool's result row (#bytes #iterations BW peak BW average
# MsgRate[Mpps]) for ib_write_bw, ib_send_bw (both through ibv_wr_*, and
# through ibv_post_send: --use_old_post_send) and mlx5-perf write_bw,
# send_bw.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
T=${CARGO_TARGET_DIR:-$ROOT/target}/release
N=${1:-20000}
S=${2:-64}
[ -n "${SKIP_BUILD:-}" ] || {
	cargo build -q --release -p tools --bin mlx5-emu --bin mlx5-perf
	cargo build -q --profile bench -p ibverbs-c
}
for b in ib_write_bw ib_send_bw; do
	command -v $b >/dev/null || { echo "NOT RUN: $b missing (apt-get install perftest)"; exit 1; }
done
W=$(mktemp -d)
EMU=
cleanup() { [ -z "$EMU" ] || kill "$EMU" 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
for n in libibverbs.so.1 libmlx5.so.1 libefa.so.1; do ln -s "$T/libibverbs.so" "$W/$n"; done
"$T/mlx5-emu" serve --functions 2 --socket "$W/sock" > "$W/emu.log" 2>&1 &
EMU=$!
for _ in $(seq 600); do [ -S "$W/sock" ] && [ -S "$W/sock.1" ] && break; sleep 0.1; done
[ -S "$W/sock.1" ] || { cat "$W/emu.log"; echo "mlx5-emu serve did not start"; exit 1; }
port=19300
listening() { ss -ltn | grep -q ":$1 "; }
# run NAME PROGRAM ARGS...: server on function 0, client on function 1.
run() {
	local name=$1 ours=$2; shift 2
	port=$((port + 1))
	local sdev cdev
	if [ "$ours" = lib ]; then
		LD_LIBRARY_PATH=$W MLX5_DEVICES="vfio-user:$W/sock" "$@" -p $port > "$W/s.log" 2>&1 &
	else
		"$@" -d "vfio-user:$W/sock" -p $port > "$W/s.log" 2>&1 &
	fi
	local srv=$!
	for _ in $(seq 600); do listening $port && break; kill -0 $srv 2>/dev/null || break; sleep 0.1; done
	if [ "$ours" = lib ]; then
		LD_LIBRARY_PATH=$W MLX5_DEVICES="vfio-user:$W/sock.1" "$@" -p $port localhost > "$W/c.log" 2>&1
	else
		"$@" -d "vfio-user:$W/sock.1" -p $port localhost > "$W/c.log" 2>&1
	fi
	wait $srv
	printf '%-40s %s\n' "$name" "$(grep -E '^ *[0-9]+ +[0-9]+ ' "$W/c.log" | tail -1)"
}
echo "#bytes #iterations BW-peak[MB/s] BW-avg[MB/s] MsgRate[Mpps]; load: $(cut -d' ' -f1-3 /proc/loadavg)"
run "ib_write_bw (libibverbs.so.1, wr_*)" lib ib_write_bw -x 0 -s "$S" -n "$N"
run "mlx5-perf write_bw" perf "$T/mlx5-perf" write_bw -x 0 -s "$S" -n "$N"
run "ib_write_bw --use_old_post_send" lib ib_write_bw -x 0 -s "$S" -n "$N" --use_old_post_send
run "ib_send_bw (libibverbs.so.1, wr_*)" lib ib_send_bw -x 0 -s "$S" -n "$N"
run "mlx5-perf send_bw" perf "$T/mlx5-perf" send_bw -x 0 -s "$S" -n "$N"
run "ib_send_bw --use_old_post_send" lib ib_send_bw -x 0 -s "$S" -n "$N" --use_old_post_send
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

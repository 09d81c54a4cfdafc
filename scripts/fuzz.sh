#!/usr/bin/env bash
# Coverage-guided fuzzing of every target in fuzz/ (or of those named) for a
# time box each, with cargo-afl (AFL++ built from the sources the crate
# ships; installed here if missing). Why cargo-afl: fuzz/Cargo.toml.
#
#   scripts/fuzz.sh [TARGET...]          MLX5_FUZZ_SECONDS per target (60)
#
# Findings go to target/afl/findings/<target>/ (MLX5_FUZZ_OUT). A crash
# fails the run: its input is listed, to be replayed with
# `cargo run -p mlx5-fuzz -- run TARGET FILE`, fixed, and kept in
# fuzz/corpus/<target>/. Prints, per target, what AFL++ reports: executions
# and edges found. MLX5_FUZZ_KEEP=1 adds the queue, minimized by afl-cmin,
# to the corpora (review before committing).
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${MLX5_FUZZ_SECONDS:-60}
out=${MLX5_FUZZ_OUT:-target/afl/findings}
afl_version=0.18.2

if ! cargo afl --version 2>/dev/null | grep -q "^cargo-afl $afl_version "; then
    echo "fuzz: installing cargo-afl $afl_version (it builds AFL++)"
    command -v make >/dev/null && command -v cc >/dev/null || {
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq make gcc >/dev/null
        fi
    }
    cargo install cargo-afl --locked --version "$afl_version"
fi
# AFL++ is built per rustc version: a toolchain update needs it again.
# (afl-fuzz -h exits non-zero: its usage text tells that it is there.)
usage=$(cargo afl fuzz -h 2>&1 || true)
case "$usage" in
*"-V seconds"*) ;;
*) cargo afl config --build --force ;;
esac

# A target dir of its own: instrumented artifacts never replace the
# workspace's ordinary ones.
export CARGO_TARGET_DIR=target/afl
cargo afl build --release -q -p mlx5-fuzz --features afl --bin mlx5-fuzz-afl
harness=target/afl/release/mlx5-fuzz-afl

if [ $# -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo run -q -p mlx5-fuzz --bin mlx5-fuzz -- list)
fi

# No UI, no CPU binding (the machine is shared), no core_pattern demand.
export AFL_NO_UI=1 AFL_NO_AFFINITY=1 AFL_SKIP_CPUFREQ=1
export AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1

stat() { sed -n "s/^$1 *: *//p" "$2"; }

failed=0
printf '%-14s %10s %8s %12s %8s %8s %6s\n' target execs exec/s edges corpus crashes hangs
for t in "${targets[@]}"; do
    dir="$out/$t"
    rm -rf "$dir"
    mkdir -p "$dir"
    # -V: the time box; -t: a generous per-input limit (a shared machine
    # stalls; the targets' own oracles catch real hangs as panics).
    if ! cargo afl fuzz -V "$secs" -t 20000 -i "fuzz/corpus/$t" -o "$dir" \
        -- "$harness" "$t" >"$dir/afl.log" 2>&1; then
        echo "fuzz: afl-fuzz failed on $t:"
        tail -20 "$dir/afl.log"
        failed=1
        continue
    fi
    s="$dir/default/fuzzer_stats"
    crashes=$(stat saved_crashes "$s")
    printf '%-14s %10s %8s %12s %8s %8s %6s\n' "$t" "$(stat execs_done "$s")" \
        "$(stat execs_per_sec "$s")" "$(stat edges_found "$s")/$(stat total_edges "$s")" \
        "$(stat corpus_count "$s")" "$crashes" "$(stat saved_hangs "$s")"
    if [ "${crashes:-0}" != 0 ]; then
        echo "fuzz: $t crashed; inputs:"
        ls "$dir"/default/crashes/id:* 2>/dev/null | sed 's/^/  /'
        failed=1
    fi
    if [ "${MLX5_FUZZ_KEEP:-0}" = 1 ]; then
        cargo afl cmin -i "$dir/default/queue" -o "$dir/cmin" -t 20000 \
            -- "$harness" "$t" >/dev/null 2>&1 || true
        for f in "$dir"/cmin/*; do
            [ -f "$f" ] || continue
            sum=$(sha1sum "$f" | cut -c1-12)
            cp -n "$f" "fuzz/corpus/$t/find-$sum"
        done
    fi
done
exit $failed

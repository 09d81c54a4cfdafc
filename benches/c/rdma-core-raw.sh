#!/usr/bin/env bash
# rdma-core's raw packet send path (libmlx5 44.0), timed without a NIC:
# compiles benches/c/rdma_core_raw.c against the rdma-core 44.0-2 build that
# the rdma-core-bench reference tool's build.sh (outside this repository)
# leaves in its cache (~/.cache/rdma-core-bench), then runs
# it; one JSON line per case on stdout (see the program's header comment and
# benches/README.md, `raw_eth`).
#
#   benches/c/rdma-core-raw.sh [--build-only] [PROGRAM ARGS...]
#       e.g. rdma-core-raw.sh --ops 2000000 --rounds 5 --locks both
#   --build-only: compile only; print the program's path.
#
# Environment:
#   RDMA_CORE_BENCH_CACHE  the cache root build.sh used (default
#                          ~/.cache/rdma-core-bench); the build is
#                          $RDMA_CORE_BENCH_CACHE/44.0-2/{build,src}
#   RDMA_CORE_RAW_OUT      where the program is built (default
#                          ${CARGO_TARGET_DIR:-<repo>/target}/rdma-core-raw)
# Nothing is downloaded or built in the cache: without it this fails,
# naming the reference build.sh.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DEB_VER=44.0-2
ROOT=${RDMA_CORE_BENCH_CACHE:-$HOME/.cache/rdma-core-bench}/$DEB_VER
BUILD=$ROOT/build
SRC=$ROOT/src/rdma-core-44.0
OUT=${RDMA_CORE_RAW_OUT:-${CARGO_TARGET_DIR:-$REPO/target}/rdma-core-raw}
EXE=$OUT/rdma_core_raw

die() { echo "rdma-core-raw.sh: $*" >&2; exit 1; }

build_only=0
if [ "${1:-}" = --build-only ]; then build_only=1; shift; fi

objs=("$BUILD"/providers/mlx5/CMakeFiles/mlx5.dir/*.o)
for need in "$BUILD/build.ninja" "$BUILD/lib/libibverbs.so.1" \
	    "$BUILD/include/infiniband/verbs.h" "$SRC/providers/mlx5/mlx5.h" \
	    "$BUILD/ccan/libccan_pic.a" "$BUILD/util/librdma_util_pic.a" \
	    "${objs[0]}"; do
	[ -e "$need" ] || die "no rdma-core $DEB_VER build in $ROOT (missing $need): run the rdma-core-bench reference tool's build.sh first (it is not part of this repository; it needs RDMA_CORE_GIT when the Debian mirror lacks the orig tarball)"
done
command -v gcc >/dev/null || die "gcc not found"

# The provider's own compile flags (Debian's hardening flags, -O3, -Wall,
# -Wextra, ...), as the reference harness is compiled.
mlx5_flags=$(awk '/^build providers\/mlx5\/CMakeFiles\/mlx5.dir\/qp.c.o/{f=1}
		  f && /^  FLAGS =/{sub(/^  FLAGS = /,""); print; exit}' "$BUILD/build.ninja")
[ -n "$mlx5_flags" ] || die "no mlx5 compile flags in $BUILD/build.ninja"
cppflags=$(DEB_BUILD_MAINT_OPTIONS=hardening=+all dpkg-buildflags --get CPPFLAGS 2>/dev/null || echo -D_FORTIFY_SOURCE=2)

mkdir -p "$OUT"
if [ ! -x "$EXE" ] ||
   [ -n "$(find "$HERE/rdma_core_raw.c" "$0" "${objs[@]}" "$BUILD/lib/libibverbs.so.1" \
	    -newer "$EXE" 2>/dev/null)" ]; then
	echo "rdma-core-raw.sh: compiling $EXE" >&2
	# shellcheck disable=SC2086
	gcc $mlx5_flags $cppflags -Werror \
	    -I"$BUILD/include" -I/usr/include/libnl3 -I"$SRC/providers/mlx5" \
	    -c "$HERE/rdma_core_raw.c" -o "$OUT/rdma_core_raw.o"
	gcc -o "$EXE.tmp" "$OUT/rdma_core_raw.o" "${objs[@]}" \
	    "$BUILD/ccan/libccan_pic.a" "$BUILD/util/librdma_util_pic.a" \
	    -Wl,-rpath,"$BUILD/lib" "$BUILD/lib/libibverbs.so.1" -lpthread
	mv "$EXE.tmp" "$EXE"
fi
if [ "$build_only" = 1 ]; then
	echo "$EXE"
	exit 0
fi
exec "$EXE" "$@"

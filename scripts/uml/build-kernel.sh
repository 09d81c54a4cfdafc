#!/usr/bin/env bash
# Build (or find) the User-Mode Linux kernel that runs Linux's mlx5 drivers
# against the device model (tests/tests/uml_mlx5.rs).
#
#   scripts/uml/build-kernel.sh          build if not cached; print the path
#   scripts/uml/build-kernel.sh --path   print the path it has or would have
#
# Source: Debian's linux-source-6.12 (/usr/src/linux-source-6.12.tar.xz),
# patched with scripts/uml/patches/*.patch and configured with
# scripts/uml/config.fragment over `make ARCH=um allnoconfig` (only what the
# test needs: see the fragment). The kernel is cached
# outside the repo, in $MLX5_UML_CACHE (default ~/.cache/mlx5-uml), as
# linux-<hash>, where <hash> covers this script, the patches, the fragment and
# the source tarball's size: any change there builds a new kernel.
# MLX5_UML_KEEP_BUILD=1 keeps the build tree (a few hundred MB) afterwards.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tarball="${LINUX_SOURCE_TARBALL:-/usr/src/linux-source-6.12.tar.xz}"
cache="${MLX5_UML_CACHE:-${HOME:-/root}/.cache/mlx5-uml}"

hash="$(
    {
        cat "$here/build-kernel.sh" "$here/config.fragment" "$here"/patches/*.patch
        stat -c %s "$tarball" 2>/dev/null || echo missing
    } | sha256sum | cut -c1-16
)"
kernel="$cache/linux-$hash"

if [[ "${1:-}" == "--path" ]]; then
    echo "$kernel"
    exit 0
fi
if [[ -x "$kernel" ]]; then
    echo "$kernel"
    exit 0
fi
if [[ ! -f "$tarball" ]]; then
    echo "build-kernel.sh: $tarball missing (apt-get install linux-source-6.12)" >&2
    exit 1
fi

build="$cache/build-$hash"
mkdir -p "$cache"
rm -rf "$build"
mkdir -p "$build"
echo "build-kernel.sh: extracting $tarball into $build" >&2
tar -xf "$tarball" -C "$build" --strip-components=1
cd "$build"
for p in "$here"/patches/*.patch; do
    echo "build-kernel.sh: applying $(basename "$p")" >&2
    patch -p1 --quiet --no-backup-if-mismatch < "$p"
done

jobs="$(nproc)"
make ARCH=um allnoconfig >/dev/null
scripts/kconfig/merge_config.sh -m .config "$here/config.fragment" >/dev/null
make ARCH=um olddefconfig >/dev/null
# Every option the fragment sets must have survived olddefconfig.
missing=0
while IFS= read -r line; do
    case "$line" in
        CONFIG_*=*)
            if ! grep -qx -- "$line" .config; then
                echo "build-kernel.sh: $line did not take (dependencies?)" >&2
                missing=1
            fi
            ;;
        "# CONFIG_"*" is not set")
            opt="${line#\# }"; opt="${opt%% *}"
            if grep -q "^$opt=" .config; then
                echo "build-kernel.sh: $opt should be unset" >&2
                missing=1
            fi
            ;;
    esac
done < "$here/config.fragment"
[[ $missing == 0 ]] || exit 1

echo "build-kernel.sh: building with $jobs jobs (nice 10)" >&2
nice -n 10 make ARCH=um -j"$jobs" linux >"$build/build.log" 2>&1 || {
    tail -40 "$build/build.log" >&2
    exit 1
}
install -m 0755 linux "$kernel.tmp"
cp .config "$kernel.config"
mv "$kernel.tmp" "$kernel"
cd "$cache"
if [[ "${MLX5_UML_KEEP_BUILD:-0}" != 1 ]]; then
    rm -rf "$build"
fi
echo "$kernel"

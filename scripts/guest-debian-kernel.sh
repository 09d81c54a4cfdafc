#!/usr/bin/env bash
# Fetches Debian's Linux 6.12 image (the newest linux-image-6.12.*-amd64)
# with `apt-get download`, and caches outside the repository its vmlinuz and
# the VFIO modules with everything they need (resolved through
# modules.dep, decompressed so busybox's insmod can load them).
#
# Prints two lines:  kernel=PATH  modules=DIR  (DIR/order lists the
# modules to insmod, dependencies first). Needs apt-get, dpkg, depmod
# (kmod) and xz.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=guest-cache.sh
. "$here/guest-cache.sh"

# The modules the test needs; their dependencies are added from modules.dep.
wanted=(vfio-pci vfio_iommu_type1)

pkg="$(apt-cache depends linux-image-6.12-amd64 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-6\.12\.[^ ]*-amd64\)$/\1/p' | head -1)"
if [ -z "$pkg" ]; then
    # No apt lists (or not Debian): use whatever is cached.
    cached="$(ls -d "$GUEST_CACHE"/debian-kernel/*/ 2>/dev/null | tail -1)"
    if [ -z "$cached" ]; then
        echo "guest-debian-kernel: apt-cache knows no linux-image-6.12-amd64 (run apt-get update; Debian 12 only)" >&2
        exit 1
    fi
    out="${cached%/}"
else
    out="$GUEST_CACHE/debian-kernel/$pkg"
fi

if [ ! -f "$out/vmlinuz" ] || [ ! -f "$out/modules/order" ]; then
    work="$(mktemp -d "$GUEST_CACHE/download.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    chmod a+rwx "$work" # apt-get download drops to the _apt user
    (cd "$work" && apt-get download -q "$pkg" >&2)
    dpkg -x "$work"/*.deb "$work/root"
    ver="$(ls "$work/root/lib/modules" | head -1)"
    depmod -b "$work/root" "$ver"
    mods="$work/root/lib/modules/$ver"
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp/modules"
    cp "$work/root/boot/vmlinuz-$ver" "$out.tmp/vmlinuz"
    echo "$ver" >"$out.tmp/version"
    # modules.dep lines: "path: dep1 dep2 ..." (deps in load-reverse order).
    declare -A seen=()
    order=()
    add() { # add MODULE_PATH after its dependencies
        local path="$1" dep
        [ -n "${seen[$path]:-}" ] && return
        seen[$path]=1
        for dep in $(grep -E "^$path:" "$mods/modules.dep" | cut -d: -f2); do
            add "$dep"
        done
        order+=("$path")
    }
    for m in "${wanted[@]}"; do
        path="$(grep -E "/${m//[-_]/[-_]}\.ko(\.xz|\.zst|\.gz)?:" "$mods/modules.dep" | cut -d: -f1 | head -1)"
        [ -n "$path" ] || { echo "guest-debian-kernel: $m not in $pkg" >&2; exit 1; }
        add "$path"
    done
    for path in "${order[@]}"; do
        name="$(basename "$path")"
        base="${name%%.ko*}"
        case "$name" in
        *.xz) xz -dc "$mods/$path" >"$out.tmp/modules/$base.ko" ;;
        *.zst) zstd -qdc "$mods/$path" >"$out.tmp/modules/$base.ko" ;;
        *.gz) gzip -dc "$mods/$path" >"$out.tmp/modules/$base.ko" ;;
        *) cp "$mods/$path" "$out.tmp/modules/$base.ko" ;;
        esac
        echo "$base" >>"$out.tmp/modules/order"
    done
    rm -rf "$out"
    mv "$out.tmp" "$out"
fi
echo "kernel=$out/vmlinuz"
echo "modules=$out/modules"

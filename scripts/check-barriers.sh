#!/usr/bin/env bash
# Assembles every barrier instruction of vfio/src/mmio.rs for the
# architecture its `cfg(target_arch)` block names, with rustc's own LLVM.
# The aarch64 standard library cannot be fetched on the project's machines,
# so the crate itself cannot be checked for aarch64 here; this check needs no
# standard library (a `no_core` crate, hence RUSTC_BOOTSTRAP for the
# feature gate: a check only, nothing built this way is shipped).
set -euo pipefail
src="$(dirname "$0")/../vfio/src/mmio.rs"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
status=0
for arch in x86_64 aarch64; do
    # The template of each asm! under `#[cfg(target_arch = "$arch")]` (up to
    # the next `cfg`; x86-64's DMA barriers are compiler fences, no asm!).
    insns=$(awk -v a="$arch" '
        /#\[cfg\(/ { want = ($0 ~ "#\\[cfg\\(target_arch = \"" a "\"\\)\\]"); next }
        want && /asm!\("/ { match($0, /asm!\("[^"]*"/); print substr($0, RSTART + 6, RLENGTH - 7); want = 0 }
        /^}/ { want = 0 }' "$src")
    if [ -z "$insns" ]; then
        echo "no $arch barrier found in $src" >&2
        status=1
        continue
    fi
    {
        cat <<'HEAD'
#![feature(no_core, lang_items, rustc_attrs, decl_macro)]
#![allow(internal_features)]
#![no_core]
#![crate_type = "lib"]
#[lang = "pointee_sized"]
pub trait PointeeSized {}
#[lang = "meta_sized"]
pub trait MetaSized: PointeeSized {}
#[lang = "sized"]
pub trait Sized: MetaSized {}
#[lang = "copy"]
pub trait Copy {}
#[rustc_builtin_macro]
pub macro asm("assembly template", $(operands,)* $(options($(option),*))?) {}
#[no_mangle]
pub unsafe fn barriers() {
HEAD
        while read -r i; do
            echo "    asm!(\"$i\", options(nostack, preserves_flags));"
        done <<<"$insns"
        echo "}"
    } >"$tmp/$arch.rs"
    if RUSTC_BOOTSTRAP=1 rustc --target "$arch-unknown-linux-gnu" -O --emit=asm \
        -o "$tmp/$arch.s" "$tmp/$arch.rs"; then
        echo "$arch: $(grep -cE '^\s+(dmb|dsb|sfence|mfence|lfence)' "$tmp/$arch.s") barrier(s) assemble:" \
            $(grep -E '^\s+(dmb|dsb|sfence|mfence|lfence)' "$tmp/$arch.s" | tr -s '\t ' ' ')
    else
        status=1
    fi
done
exit $status

#!/usr/bin/env bash
# Build (or find) the Debian trixie guest that runs the whole Linux RDMA stack
# on the device model in QEMU (issue 17): a root file system with QEMU 11 (its
# vfio-user-pci client) from trixie-backports, the trixie kernel (mlx5_core,
# mlx5_ib, ib_uverbs as modules), rdma-core userspace, pyverbs, perftest,
# rdmacm-utils, scapy (rdma-core's DevX and steering tests build packets
# with it), DPDK's testpmd with its mlx5 PMD (issue 26's outside judge of
# raw Ethernet queues through mlx5_ib), ethtool, tcpdump, ping and iperf3
# (mlx5e's traffic as users measure it), rdma-core's own tests/ (from the
# upstream tarball), and an
# initrd whose init mounts that root read-only over 9p and runs the guest
# script /guest/init.sh (see run.sh).
#
#   scripts/qemu-guest/build.sh          build if not cached; print the path
#   scripts/qemu-guest/build.sh --path   print the path it has or would have
#
# Needs root (debootstrap, chroot) and Debian's registry (the mirror this
# host's apt uses, or $DEBIAN_MIRROR). The guest is cached outside the repo,
# in $MLX5_QEMU_GUEST_CACHE (default ~/.cache/mlx5-qemu-guest), as <hash>/,
# where <hash> covers this script (the package list and the init are in it):
# any change here builds a new guest. A build goes to build-<hash>/ and is
# renamed only when complete, so a cut-off build is never taken for a guest.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${MLX5_QEMU_GUEST_CACHE:-${HOME:-/root}/.cache/mlx5-qemu-guest}"
hash="$(cat "$here/build.sh" | sha256sum | cut -c1-16)"
guest="$cache/$hash"

if [[ "${1:-}" == "--path" ]]; then
    echo "$guest"
    exit 0
fi
if [[ -f "$guest/initrd.gz" && -x "$guest/root/usr/bin/qemu-system-x86_64" ]]; then
    echo "$guest"
    exit 0
fi
say() { echo "build.sh: $*" >&2; }
if [[ $(id -u) != 0 ]]; then
    say "needs root (debootstrap and chroot)"
    exit 1
fi

# The Debian mirror this host's apt already uses (it serves trixie too).
mirror="${DEBIAN_MIRROR:-}"
if [[ -z "$mirror" ]]; then
    mirror="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null |
        grep -v security | head -1 || true)"
fi
if [[ -z "$mirror" ]]; then
    mirror="$(grep -hm1 -oE '^deb +https?://[^ ]+' /etc/apt/sources.list 2>/dev/null |
        awk '{print $2}' | grep -v security | head -1 || true)"
fi
if [[ -z "$mirror" ]]; then
    say "no Debian mirror in this host's apt sources; set DEBIAN_MIRROR"
    exit 1
fi
if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    apt-get install -y -qq debootstrap >/dev/null
fi

build="$cache/build-$hash"
root="$build/root"
mkdir -p "$cache"
rm -rf "$build"
mkdir -p "$build"
start=$SECONDS

say "debootstrap trixie from $mirror into $root"
debootstrap --variant=minbase --include=ca-certificates trixie "$root" "$mirror" \
    >"$build/debootstrap.log" 2>&1 || {
    tail -20 "$build/debootstrap.log" >&2
    exit 1
}
echo "deb $mirror trixie-backports main" >"$root/etc/apt/sources.list.d/backports.list"
echo "deb-src $mirror trixie main" >"$root/etc/apt/sources.list.d/src.list"
# The guest never runs services at install time.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"

# Everything in the chroot runs in a mount namespace of its own, so the
# /proc, /sys and /dev mounts vanish with it, whatever happens.
in_root() {
    unshare --mount --propagation private -- bash -euc '
        r=$1; shift
        for m in proc sys dev; do mount --bind /$m "$r/$m"; done
        chroot "$r" /usr/bin/env DEBIAN_FRONTEND=noninteractive LC_ALL=C bash -euc "$1"
    ' in_root "$root" "$1"
}

# libelf-dev (for dpdk-dev, which carries testpmd) from trixie-backports:
# backports' QEMU brings backports' libelf1t64, which trixie's libelf-dev
# would have to downgrade.
say "installing QEMU (trixie-backports), the kernel and rdma-core"
in_root '
    apt-get update -qq
    apt-get install -y -qq -t trixie-backports --no-install-recommends \
        qemu-system-x86 qemu-system-data seabios ipxe-qemu
    apt-get install -y -qq --no-install-recommends \
        linux-image-amd64 busybox-static kmod pciutils iproute2 \
        rdma-core ibverbs-utils ibverbs-providers perftest python3-pyverbs rdmacm-utils \
        python3-scapy dpdk-dev libelf-dev/trixie-backports librte-net-mlx5-25 ethtool tcpdump \
        iputils-ping iperf3
    apt-get clean
' >"$build/apt.log" 2>&1 || {
    tail -30 "$build/apt.log" >&2
    exit 1
}

# rdma-core's own test suite: its tests/ directory from the upstream
# tarball (apt-get source fetches it even where the .dsc is refused).
say "fetching rdma-core's source for its tests/"
in_root 'cd /tmp && apt-get source --download-only rdma-core' >"$build/source.log" 2>&1 || true
orig="$(ls "$root"/tmp/rdma-core_*.orig.tar.gz 2>/dev/null | head -1 || true)"
if [[ -z "$orig" ]]; then
    tail -20 "$build/source.log" >&2
    say "rdma-core's orig tarball was not fetched"
    exit 1
fi
mkdir -p "$root/opt/rdma-core"
tar -xzf "$orig" -C "$root/opt/rdma-core" --strip-components=1
rm -f "$root"/tmp/rdma-core_*
test -f "$root/opt/rdma-core/tests/run_tests.py"
mkdir -p "$root/guest"

# The initrd: busybox, the 9p modules (decompressed: busybox's insmod cannot
# read .ko.xz) and an init that mounts the root over 9p and hands over to
# the guest script.
kv="$(ls "$root/lib/modules" | head -1)"
cp "$root/boot/vmlinuz-$kv" "$build/vmlinuz"
initrd="$build/initrd"
mkdir -p "$initrd"/{bin,proc,sys,dev,newroot,mods}
cp "$root/bin/busybox" "$initrd/bin/"
for m in fs/netfs/netfs net/9p/9pnet net/9p/9pnet_virtio fs/9p/9p; do
    xz -dc "$root/lib/modules/$kv/kernel/$m.ko.xz" >"$initrd/mods/$(basename "$m").ko"
done
cat >"$initrd/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in netfs 9pnet 9pnet_virtio 9p; do insmod /mods/$m.ko || echo "initrd: insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 root /newroot || {
    echo "initrd: 9p root mount failed"; poweroff -f; }
mount --move /proc /newroot/proc; mount --move /sys /newroot/sys; mount --move /dev /newroot/dev
exec switch_root /newroot /guest/init.sh
INIT
chmod +x "$initrd/init"
(cd "$initrd" && find . | cpio -o -H newc 2>/dev/null | gzip >"$build/initrd.gz")
rm -rf "$initrd"
echo "$kv" >"$build/kernel-version"
chroot "$root" qemu-system-x86_64 --version 2>/dev/null | head -1 >"$build/qemu-version" || true

rm -rf "$guest"
mv "$build" "$guest"
say "built in $((SECONDS - start)) s: kernel $kv"
echo "$guest"

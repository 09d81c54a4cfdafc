#!/usr/bin/env bash
# Runs every test of the workspace, installing what the tests need first.
# On Debian as root it installs missing packages with apt-get; elsewhere it
# says what it could not install and the tests that need it say they skip.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
# The PRM check compares every layout with Linux 6.12's mlx5_ifc.h.
[ -f /usr/src/linux-source-6.12.tar.xz ] || need_pkgs+=(linux-source-6.12)
# tests/tests/uml_mlx5.rs boots a User-Mode Linux kernel built from that
# source (scripts/uml/build-kernel.sh); building it needs these.
if command -v dpkg >/dev/null; then
    for p in gcc make libc6-dev flex bison libelf-dev bc patch xz-utils perl; do
        dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
    done
    # tests/tests/c_abi.rs and pyverbs.rs run the distribution's verbs
    # programs, perftest and pyverbs on ibverbs-c (libibverbs.so.1);
    # rdma-core's DevX tests build their PRM commands with scapy.
    for p in ibverbs-utils perftest libibverbs-dev python3-pyverbs python3-scapy; do
        dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
    done
fi

# tests/tests/wire_tshark.rs: Wireshark's tshark and Python judge the
# model's RoCEv2 frames.
command -v tshark >/dev/null || need_pkgs+=(tshark)
command -v python3 >/dev/null || need_pkgs+=(python3)

if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test-all: installing ${need_pkgs[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
    else
        echo "test-all: cannot install ${need_pkgs[*]} (not root on Debian); tests that need them will say so"
    fi
fi

# The UML kernel for uml_mlx5: reused from ~/.cache/mlx5-uml (MLX5_UML_CACHE)
# when the build script, its patches and its config are unchanged; otherwise
# built here, once per change (a small allnoconfig-based kernel: see
# docs/ARCHITECTURE.md for the times). MLX5_UML_BUILD=0 opts out: then
# uml_mlx5 runs only if a kernel is already cached, and says it skips if not.
uml_script=scripts/uml/build-kernel.sh
uml_kernel="$(bash "$uml_script" --path)"
uml_missing=()
for t in gcc make flex bison bc patch xz perl; do
    command -v "$t" >/dev/null || uml_missing+=("$t")
done
[ -f /usr/include/libelf.h ] || uml_missing+=(libelf-dev)
[ -f /usr/src/linux-source-6.12.tar.xz ] || uml_missing+=(linux-source-6.12)
if [ -x "$uml_kernel" ]; then
    echo "test-all: UML kernel cached: $uml_kernel"
elif [ "${MLX5_UML_BUILD:-1}" = 0 ]; then
    echo "test-all: MLX5_UML_BUILD=0: not building the UML kernel; uml_mlx5 will say it skips"
elif [ ${#uml_missing[@]} -gt 0 ]; then
    echo "test-all: cannot build the UML kernel (missing ${uml_missing[*]}); uml_mlx5 will say it skips"
else
    echo "test-all: building the UML kernel for uml_mlx5 into $uml_kernel (not cached for this script version)"
    start=$SECONDS
    bash "$uml_script" >/dev/null
    echo "test-all: UML kernel built in $((SECONDS - start)) s"
fi
if [ -x "$uml_kernel" ]; then
    MLX5_UML_KERNEL="$uml_kernel"
    export MLX5_UML_KERNEL
fi

# kernel_vfio boots a QEMU guest (q35, emulated Intel IOMMU, QEMU's edu
# device) with Debian's 6.12 kernel and runs the kernel VFIO backend in it;
# its RDMA boots (two model functions over vfio-user, reg_mr_raw of user
# memory through the guest's VFIO) use the qemu_mlx5 root's QEMU (below).
guest_pkgs=()
command -v qemu-system-x86_64 >/dev/null || guest_pkgs+=(qemu-system-x86)
command -v busybox >/dev/null || guest_pkgs+=(busybox-static)
command -v cpio >/dev/null || guest_pkgs+=(cpio)
command -v depmod >/dev/null || guest_pkgs+=(kmod)
command -v xz >/dev/null || guest_pkgs+=(xz-utils)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # The guest kernel comes from `apt-get download`, which needs the lists.
    if [ ${#guest_pkgs[@]} -gt 0 ] || ! apt-cache show linux-image-6.12-amd64 >/dev/null 2>&1; then
        apt-get update -qq
    fi
    if [ ${#guest_pkgs[@]} -gt 0 ]; then
        echo "test-all: installing ${guest_pkgs[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${guest_pkgs[@]}" >/dev/null
    fi
    # Everything is there: a guest check that cannot run is a failure.
    export MLX5_KERNEL_VFIO_REQUIRED=1
    # Root can grow the 2 MiB huge-page pool (tests::hugepages reserves
    # what each test uses and gives it back): a hugepage test that finds
    # none is a failure. 1 GiB pages may be unavailable on a fragmented
    # machine; those tests say NOT RUN.
    export MLX5_HUGEPAGES_REQUIRED=1
    # The cdev (iommufd) path and no-IOMMU mode need a 6.12 built with
    # IOMMUFD and VFIO_NOIOMMU: 15 (idle) to 35 (shared) minutes on 2 cores,
    # more than this suite's budget, so it is built only on request (then
    # cached outside the repo, and the test uses it from then on).
    if [ "${MLX5_BUILD_GUEST_KERNEL:-0}" = 1 ]; then
        bash scripts/guest-kernel-iommufd.sh >/dev/null
    fi
else
    echo "test-all: not root on Debian: kernel_vfio reports its guest checks skipped" \
        "unless qemu-system-x86 busybox-static cpio kmod xz-utils are installed"
fi

# qemu_mlx5 boots a Debian trixie guest (QEMU 11's vfio-user-pci client) with
# two model functions as PCI devices and Linux's mlx5_core/mlx5_ib on them,
# perftest and rdma-core's whole suite (~15 min under TCG), then a second
# boot with an emulated IOMMU and our driver through the guest's VFIO
# (~5 min; the first run also builds mlx5 + mlx5-perf in release). Its root is built once (debootstrap from Debian's
# registry: about 7 minutes on 2 cores), cached in ~/.cache/mlx5-qemu-guest
# by content hash. MLX5_QEMU_GUEST_BUILD=0 skips the build (the test then
# says it skips, unless the guest is cached).
if [ "$(id -u)" = 0 ] && [ "${MLX5_QEMU_GUEST_BUILD:-1}" = 1 ]; then
    if bash scripts/qemu-guest/build.sh >/dev/null; then
        export MLX5_QEMU_MLX5_REQUIRED=1
    else
        echo "test-all: scripts/qemu-guest/build.sh failed; qemu_mlx5 will say why it skips"
    fi
fi

# Generated layouts must be what their declarations give.
cargo run -q -p mlx5-hw-gen -- --check

cargo test --workspace --all-targets
cargo test --workspace --doc

# verbs_dmabuf's udmabuf test is #[ignore]d because these hosts have no
# /dev/udmabuf; where the module loads (as root) or the device exists, it runs.
if [ "$(id -u)" = 0 ]; then
    modprobe udmabuf 2>/dev/null || true
fi
if [ -e /dev/udmabuf ]; then
    cargo test -p tests --test verbs_dmabuf -- --ignored
fi

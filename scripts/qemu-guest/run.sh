#!/usr/bin/env bash
# Run a script inside the QEMU guest of build.sh, with two cabled functions of
# one `mlx5-emu serve --functions 2` as its PCI devices (issue 17).
#
#   scripts/qemu-guest/run.sh GUEST_SCRIPT [OUT_DIR]
#
# GUEST_SCRIPT runs as the guest's init (root read-only over 9p; mount your
# own tmpfs; power off with `echo o > /proc/sysrq-trigger`). OUT_DIR (default
# a fresh temporary directory, printed) receives console.log (the guest's
# serial console: kernel log and the script's output), emu.log and qemu.rc.
#
# Environment: MLX5_QEMU_IOMMU=1 (an emulated Intel IOMMU, caching-mode on,
# interrupt remapping; the kernel boots intel_iommu=on iommu=pt, so Linux's
# drivers keep identity DMA and vfio-pci gets translated domains),
# MLX5_QEMU_BINS (host binaries copied, without debug info, into the run
# directory: /guest/NAME in the guest), MLX5_EMU (the repo's mlx5-emu binary; default
# debug/mlx5-emu under CARGO_TARGET_DIR, else target/ beside this script's repo;
# `served`: the caller
# already serves OUT_DIR/cx.sock and cx.sock.1, as tests/tests/qemu_mlx5.rs
# does in-process), MLX5_EMU_PROFILE (default cx4lx), MLX5_QEMU_TIMEOUT
# (seconds, default 900), MLX5_QEMU_APPEND (more kernel command-line words:
# NAME=VALUE ones reach the guest script's environment, e.g.
# RDMA_SUITE_FILES=test_odp), RUST_LOG, MLX5_QEMU_FUNCTIONS (2, the default,
# or 0: no model function in the guest, nothing served), MLX5_QEMU_NET (more
# QEMU arguments, e.g. the NICs of the rxe guest, tests/tests/qemu_rxe.rs);
# MLX5_QEMU_KERNEL and MLX5_QEMU_INITRD (host files: boot this kernel and
# initramfs instead of the guest's own, the guest root serving only QEMU;
# GUEST_SCRIPT is then `-`).
#
# QEMU runs from the guest root (chroot, in a mount namespace of its own, so
# nothing stays mounted): q35 under TCG, 2 GiB of guest RAM as a shared memfd
# (the server maps guest memory by the fd QEMU sends), the root over 9p, and
# each function a vfio-user-pci device behind its own pcie-root-port (on the
# root bus Linux reads its link as unknown).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
script="${1:?usage: run.sh GUEST_SCRIPT [OUT_DIR]}"
out="${2:-$(mktemp -d /tmp/mlx5-qemu-run.XXXXXX)}"
emu="${MLX5_EMU:-${CARGO_TARGET_DIR:-$repo/target}/debug/mlx5-emu}"
profile="${MLX5_EMU_PROFILE:-cx4lx}"
tmo="${MLX5_QEMU_TIMEOUT:-900}"
functions="${MLX5_QEMU_FUNCTIONS:-2}"

guest="$("$here/build.sh" --path)"
if [[ ! -f "$guest/initrd.gz" ]]; then
    echo "run.sh: no guest at $guest (run scripts/qemu-guest/build.sh)" >&2
    exit 1
fi
if [[ "$emu" != served && ! -x "$emu" ]]; then
    echo "run.sh: no mlx5-emu at $emu (cargo build -p tools --bin mlx5-emu)" >&2
    exit 1
fi
mkdir -p "$out"
out="$(cd "$out" && pwd)"
rm -f "$out"/{console.log,emu.log,qemu.rc,initrd.gz}
[[ "$script" == - ]] || cp "$script" "$out/init.sh"
# The guest scripts' helpers (/guest/*.py, perftest.sh, eth_pair.sh and dpdk.sh in the guest).
cp "$here"/guest/*.py "$here"/guest/perftest.sh "$here"/guest/eth_pair.sh "$here"/guest/dpdk.sh "$out/"
cp "${MLX5_QEMU_INITRD:-$guest/initrd.gz}" "$out/initrd.gz"
[[ "$script" == - ]] || chmod +x "$out/init.sh"
kernel=/boot/vmlinuz-$(cat "$guest/kernel-version")
if [[ -n "${MLX5_QEMU_KERNEL:-}" ]]; then
    cp "$MLX5_QEMU_KERNEL" "$out/kernel"
    kernel=/guest/kernel
fi

if [[ "$functions" == 0 ]]; then
    :
elif [[ "$emu" != served ]]; then
    rm -f "$out"/cx.sock "$out"/cx.sock.1
    RUST_LOG="${RUST_LOG:-info}" "$emu" serve --socket "$out/cx.sock" --profile "$profile" --trap-control-pages \
        --functions 2 >"$out/emu.log" 2>&1 &
    emu_pid=$!
    trap 'kill "$emu_pid" 2>/dev/null; wait "$emu_pid" 2>/dev/null || true' EXIT
    for _ in $(seq 200); do
        [[ -S "$out/cx.sock.1" ]] && break
        sleep 0.05
    done
fi
if [[ "$functions" != 0 && ! -S "$out/cx.sock.1" ]]; then
    echo "run.sh: nothing listens on $out/cx.sock.1; see $out/emu.log" >&2
    exit 1
fi

for b in ${MLX5_QEMU_BINS:-}; do
    objcopy --strip-debug "$b" "$out/$(basename "$b")" 2>/dev/null || cp "$b" "$out/"
done
iommu_dev="" iommu_args=""
if [[ "${MLX5_QEMU_IOMMU:-0}" == 1 ]]; then
    iommu_dev="-device intel-iommu,intremap=on,caching-mode=on"
    iommu_args="intel_iommu=on iommu=pt"
fi
# x-msg-timeout: how long QEMU waits for the server's reply to a message
# (5 s by default). With the IOMMU the guest's vfio-pci maps and unmaps
# pages one message each (13,000 mappings at once); each map once copied
# every mapping (vm-memory's GuestMemoryMmap), and under stress-ng one
# reply took 26 s. vfio::IovaMemory copies one chunk instead; 30 s stays
# as headroom for a loaded 2-core host under TCG.
pci_dev=""
if [[ "$functions" != 0 ]]; then
    pci_dev='-device pcie-root-port,id=rp1,chassis=1 -device pcie-root-port,id=rp2,chassis=2
        -device {"driver":"vfio-user-pci","bus":"rp1","x-msg-timeout":30000,"socket":{"path":"/guest/cx.sock","type":"unix"}}
        -device {"driver":"vfio-user-pci","bus":"rp2","x-msg-timeout":30000,"socket":{"path":"/guest/cx.sock.1","type":"unix"}}'
fi

# The CPU: QEMU's default qemu64 plus what x86-64-v2 adds (SSSE3, SSE4.1,
# SSE4.2, POPCNT), which every ConnectX host has and DPDK's EAL refuses
# to start without (rte_cpu_is_supported, Debian's generic build).
cpu="qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt"
append="console=ttyS0 loglevel=7 panic=-1 $iommu_args ${MLX5_QEMU_APPEND:-}"
# The run directory appears in the guest root as /guest (script, sockets).
set +e
timeout "$tmo" unshare --mount --propagation private -- bash -euc '
    root=$1; out=$2; kernel=$3; iommu_dev=$4; append=$5; pci_dev=$6; net=$7; cpu=$8
    mount --bind "$out" "$root/guest"
    for m in dev proc sys; do mount --bind /$m "$root/$m"; done
    exec chroot "$root" qemu-system-x86_64 \
        -machine q35,accel=tcg -cpu "$cpu" -m 2G -smp 2 -nographic -no-reboot -nic none \
        -object memory-backend-memfd,id=mem,size=2G,share=on -machine memory-backend=mem \
        -kernel "$kernel" -initrd /guest/initrd.gz \
        -append "$append" $iommu_dev \
        -virtfs local,path=/,mount_tag=root,security_model=none,readonly=on \
        $pci_dev $net
' run "$guest/root" "$out" "$kernel" "$iommu_dev" "$append" "$pci_dev" "${MLX5_QEMU_NET:-}" "$cpu" </dev/null >"$out/console.log" 2>&1
rc=$?
set -e
echo "$rc" >"$out/qemu.rc"
echo "$out"

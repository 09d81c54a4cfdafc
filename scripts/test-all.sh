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
fi

if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test-all: installing ${need_pkgs[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
    else
        echo "test-all: cannot install ${need_pkgs[*]} (not root on Debian); tests that need them will say so"
    fi
fi

# The UML kernel for uml_mlx5: reused from ~/.cache/mlx5-uml when the build
# script, its patches and config are unchanged; otherwise built (~12 min on
# 2 cores, ~25 min on a loaded machine, once per change). uml_mlx5 is
# #[ignore]d until the model has flow steering, so the suite builds the
# kernel only when asked: MLX5_UML_BUILD=1.
if [ "${MLX5_UML_BUILD:-0}" = 1 ]; then
    if ! bash scripts/uml/build-kernel.sh --path | xargs test -x; then
        echo "test-all: building the UML kernel for uml_mlx5 (first time for this script version)"
    fi
    MLX5_UML_KERNEL="$(bash scripts/uml/build-kernel.sh)"
    export MLX5_UML_KERNEL
    echo "test-all: UML kernel $MLX5_UML_KERNEL"
else
    echo "test-all: not building the UML kernel (MLX5_UML_BUILD=1 does); uml_mlx5 is ignored for now"
fi

# Generated layouts must be what their declarations give.
cargo run -q -p mlx5-hw-gen -- --check

cargo test --workspace --all-targets
cargo test --workspace --doc

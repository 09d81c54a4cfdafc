#!/usr/bin/env bash
# Runs every test of the workspace, installing what the tests need first.
# On Debian as root it installs missing packages with apt-get; elsewhere it
# says what it could not install and the tests that need it say they skip.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
# The PRM check compares every layout with Linux 6.12's mlx5_ifc.h.
[ -f /usr/src/linux-source-6.12.tar.xz ] || need_pkgs+=(linux-source-6.12)

if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test-all: installing ${need_pkgs[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
    else
        echo "test-all: cannot install ${need_pkgs[*]} (not root on Debian); tests that need them will say so"
    fi
fi

# Generated layouts must be what their declarations give.
cargo run -q -p mlx5-hw-gen -- --check

cargo test --workspace --all-targets
cargo test --workspace --doc

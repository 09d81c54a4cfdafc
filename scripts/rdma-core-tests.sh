#!/usr/bin/env bash
# Fetches rdma-core's own test suite (its tests/ directory) for the
# installed python3-pyverbs, the way scripts/qemu-guest/build.sh fetches it
# for the guest: `apt-get source --download-only rdma-core` (the orig
# tarball, checked by apt against the signed .dsc), here with a private apt
# state so the system's sources are not touched. The installed version's
# source first; where the mirror lacks its tarball (bookworm's 44.0 is
# gone from deb.debian.org's pool), trixie's, as the guest uses. Unpacked once into
# ~/.cache/mlx5-rdma-core-tests/<sha256 of the tarball> (MLX5_RDMA_CORE_CACHE
# moves it); prints that directory (it holds tests/run_tests.py).
set -euo pipefail
cache="${MLX5_RDMA_CORE_CACHE:-$HOME/.cache/mlx5-rdma-core-tests}"
ver="$(dpkg-query -W -f='${Version}' python3-pyverbs)"
. /etc/os-release
mkdir -p "$cache/apt/lists/partial" "$cache/dl"
stamp="$cache/by-version/$ver"
if [[ -f "$stamp" ]] && [[ -f "$(cat "$stamp")/tests/run_tests.py" ]]; then
    cat "$stamp"
    exit 0
fi
# One fetch at a time: the pyverbs tests call this at once, and two apt
# runs on one private state (no apt locking) or one download directory
# undo each other's files. The second finds the first's result.
exec 9>"$cache/fetch.lock"
flock 9
if [[ -f "$stamp" ]] && [[ -f "$(cat "$stamp")/tests/run_tests.py" ]]; then
    cat "$stamp"
    exit 0
fi
# The Debian mirror this machine's apt already uses (its first URI).
mirror="$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)"
[[ -n "$mirror" ]] || mirror="$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list 2>/dev/null)"
if [[ -z "$mirror" ]]; then
    echo "rdma-core-tests: no apt mirror configured on this machine" >&2
    exit 1
fi
printf 'deb-src %s %s main\ndeb-src %s trixie main\n' \
    "$mirror" "$VERSION_CODENAME" "$mirror" >"$cache/apt/sources.list"
opts=(-o "Dir::Etc::SourceList=$cache/apt/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
      -o "Dir::State::Lists=$cache/apt/lists" -o "Debug::NoLocking=1")
apt-get "${opts[@]}" update -qq >&2
rm -f "$cache"/dl/rdma-core_*
# apt-get source fetches the tarball even where the .dsc is refused (as
# build.sh notes): what counts is whether the tarball arrived.
(cd "$cache/dl" && apt-get "${opts[@]}" source --download-only "rdma-core=$ver" >&2) || true
if ! ls "$cache"/dl/rdma-core_*.orig.tar.gz >/dev/null 2>&1; then
    (cd "$cache/dl" && apt-get "${opts[@]}" source --download-only rdma-core/trixie >&2) || true
fi
orig="$(ls "$cache"/dl/rdma-core_*.orig.tar.gz 2>/dev/null | head -1 || true)"
if [[ -z "$orig" ]]; then
    echo "rdma-core-tests: rdma-core's orig tarball could not be fetched" >&2
    exit 1
fi
sum="$(sha256sum "$orig" | cut -c1-16)"
dir="$cache/$sum"
if [[ ! -f "$dir/tests/run_tests.py" ]]; then
    rm -rf "$dir.tmp"
    mkdir -p "$dir.tmp"
    tar -xzf "$orig" -C "$dir.tmp" --strip-components=1
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
fi
rm -f "$cache"/dl/rdma-core_*
mkdir -p "$cache/by-version"
echo "$dir" >"$stamp"
echo "$dir"

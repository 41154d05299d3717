#!/usr/bin/env bash
# install-deps.sh — the packages kiln builds and tests with, from Debian/Ubuntu.
#   build:  cmake, a C17 compiler, pkg-config, jansson, zstd, xxhash, pcre2,
#           LLVM 16 (its C API: `kiln package` writes standalone executables)
#   tests:  python3 (standard library only, for the CLI tests), clang + its
#           runtime (libFuzzer targets), binutils (readelf, nm: the linkage
#           test), util-linux (unshare: the linkage test hides the toolkit),
#           man-db (check-install renders the man pages; optional)
# The CUDA toolkit is optional: when present the GPU parts are built too.
set -euo pipefail
pkgs=(cmake make gcc pkg-config libjansson-dev libzstd-dev libxxhash-dev libpcre2-dev llvm-16-dev python3 clang
      libclang-rt-dev binutils util-linux man-db)
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
SUDO=
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

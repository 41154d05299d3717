#!/usr/bin/env bash
# install-deps.sh — the packages kiln builds and tests with, from Debian/Ubuntu.
#   build:  cmake, a C17 compiler, pkg-config, jansson, zstd, xxhash, pcre2,
#           libmicrohttpd (kiln serve),
#           LLVM 16 (its C API: `kiln package` writes standalone executables)
#   tests:  python3 (standard library only, for the CLI tests; tests/cli_serve.sh
#           also pip-installs the openai package when PyPI is reachable), clang + its
#           runtime (libFuzzer targets), binutils (readelf, nm: the linkage
#           test), util-linux (unshare: the linkage test hides the toolkit),
#           man-db (check-install renders the man pages; optional)
# The CUDA toolkit is optional: when present the GPU parts are built too.
set -euo pipefail
pkgs=(cmake make gcc pkg-config libjansson-dev libzstd-dev libxxhash-dev libpcre2-dev libmicrohttpd-dev llvm-16-dev python3 python3-pip clang
      libclang-rt-dev binutils util-linux man-db)
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
    SUDO=
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The openai client for tests/cli_serve.sh (tests only; that part is skipped when this fails).
python3 -c "import openai" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages openai >/dev/null 2>&1 ||
    echo "install-deps: note: pip could not install the openai package; tests/cli_serve.sh skips its client checks" >&2

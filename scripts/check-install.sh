#!/usr/bin/env bash
# check-install.sh — install kiln into a temporary prefix and build
# docs/examples/generate.c against it out of the tree, with the commands of
# docs/c-api.md ("Building a program against an installed kiln") exactly as
# they stand there: each block marked <!-- check-install: NAME --> is read
# from the document and run. Then every program (shared and static, through
# pkg-config and through find_package) runs on stories260k with --device cpu
# and must print HF's greedy ids (as ctest example_generate checks), and the
# installed files are checked (SONAME, NEEDED, RUNPATH, header, man pages).
#
#   scripts/check-install.sh            (scripts/test.sh runs it after ctest)
# Environment: KILN_SHARED_DIR (default ../shared), KILN_KEEP=1 keeps the
# temporary folders.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
doc=$root/docs/c-api.md
SHARED=$(cd "${KILN_SHARED_DIR:-$root/../shared}" && pwd)
tmp=$(mktemp -d)
PREFIX=$tmp/prefix
export PREFIX SHARED
[ "${KILN_KEEP:-0}" = 1 ] || trap 'rm -rf "$tmp"' EXIT

fails=0
fail() { echo "check-install: FAIL: $*" >&2; fails=$((fails + 1)); }
ok() { echo "check-install: ok: $*"; }

# The body of the fenced block after <!-- check-install: NAME --> in c-api.md.
block() {
    local text
    text=$(awk -v name="$1" '
        $0 == "<!-- check-install: " name " -->" { want = 1; next }
        want && /^```/ { if (inside) exit; inside = 1; next }
        inside { print }' "$doc")
    [ -n "$text" ] || { echo "check-install: no block '$1' in $doc" >&2; exit 1; }
    printf '%s\n' "$text"
}
# Run a block with bash -euo pipefail in folder $2, echoing it first.
run_block() {
    echo "check-install: running docs/c-api.md block '$1' in $2:"
    block "$1" | sed 's/^/    /'
    (cd "$2" && bash -euo pipefail -c "$(block "$1")")
}

# 1. install
run_block install "$root"
for f in bin/kiln bin/kiln-run include/kiln.h lib/libkiln.a lib/libkiln.so lib/pkgconfig/kiln.pc \
         lib/cmake/kiln/kilnConfig.cmake share/man/man1/kiln.1 share/man/man1/kiln-run.1; do
    [ -e "$PREFIX/$f" ] || fail "not installed: $f"
done
soname=$(readelf -d "$PREFIX/lib/libkiln.so" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
[ "$soname" = libkiln.so.0 ] && [ -f "$PREFIX/lib/libkiln.so.0" ] && ok "libkiln.so SONAME $soname" ||
    fail "libkiln.so SONAME '$soname'"
readelf -d "$PREFIX/bin/kiln-run" | grep -q 'RUNPATH.*\$ORIGIN' && ok "kiln-run RUNPATH has \$ORIGIN" ||
    fail "installed kiln-run has no \$ORIGIN RUNPATH (a libcublasLt beside it would not be found)"
if command -v man >/dev/null 2>&1; then
    for m in kiln kiln-run; do
        MANWIDTH=80 man -l "$PREFIX/share/man/man1/$m.1" 2>&1 | grep -q "^NAME" && ok "man -l $m.1 renders" ||
            fail "man -l $m.1 does not render"
    done
fi
"$PREFIX/bin/kiln-run" --version >/dev/null && "$PREFIX/bin/kiln" --version >/dev/null ||
    fail "installed kiln or kiln-run --version failed"

# 2. build generate.c out of the tree: pkg-config (shared, static), CMake (both)
work=$tmp/work
mkdir -p "$work/cmake"
cp "$root/docs/examples/generate.c" "$work/"
cp "$root/docs/examples/generate.c" "$work/cmake/"
run_block pkg-config "$work"
block CMakeLists.txt >"$work/cmake/CMakeLists.txt"
run_block cmake "$work/cmake"

needs() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p' | tr '\n' ' '; }
for p in generate cmake/build/generate; do
    [[ " $(needs "$work/$p") " == *" libkiln.so.0 "* ]] && ok "$p NEEDS libkiln.so.0" || fail "$p does not NEED libkiln.so.0"
done
for p in generate-static cmake/build/generate-static; do
    [[ " $(needs "$work/$p") " != *libkiln* ]] && ok "$p is linked with libkiln.a (no libkiln NEEDED)" ||
        fail "$p NEEDS libkiln.so: $(needs "$work/$p")"
done

# 3. run: the doc's block (compile + ./generate), then the same command with each other program
out=$(run_block run "$work")
expect() {
    grep -qx '\[1\] 461 461 401 401 401 461 378 455 473 456' <<<"$2" &&
        grep -qx '\[2\] 304 422 422 457 473 304 451 303 284 284' <<<"$2" && ok "$1: HF's greedy ids" ||
        fail "$1: not HF's greedy ids:
$2"
}
expect generate "$out"
cmd=$(block run | grep '^\./generate ')
for p in generate-static cmake/build/generate cmake/build/generate-static; do
    expect "$p" "$(cd "$work" && bash -euo pipefail -c "./$p ${cmd#./generate }")"
done
# kiln-run, installed, on the same engine
ids=$("$PREFIX/bin/kiln-run" run "$work/stories.kiln" --device cpu --prompt-ids 1 --max-tokens 10 --json |
      grep -o '"ids": *\[[^]]*\]' | tr -d ' ' || true)
[ "$ids" = '"ids":[461,461,401,401,401,461,378,455,473,456]' ] && ok "installed kiln-run: HF's greedy ids" ||
    fail "installed kiln-run run gave '$ids'"

[ "$fails" -eq 0 ] || { echo "check-install: $fails check(s) failed" >&2; exit 1; }
echo "check-install: all checks passed"

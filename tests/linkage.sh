#!/usr/bin/env bash
# linkage.sh — what the shipped binaries link and load (issue 11; ctest "linkage").
#
#   linkage.sh KILN KILN_RUN LIBKILN_SO SOURCE_DIR [SHARED_DIR]
#
# The rule (README "What ships where"): kiln-run and libkiln.so are the
# runtime alone. They must not NEED libnvrtc, libLLVM, the driver or
# cuBLASLt (the last two are dlopened when a GPU context is made); what they
# NEED must be in the allow-list below. kiln (the full tool) must not NEED
# libnvrtc (it dlopens it to compile kernels), the driver or cuBLASLt.
# Besides the dynamic section:
#   - kiln-run holds no symbol of the front end (compiler/ beyond the CLI
#     library, passes/, codegen/, ir/, NVRTC glue): its defined global symbols
#     are compared with those of those static libraries in the build folder;
#   - libkiln.so exports exactly the functions runtime/kiln.h declares;
#   - `kiln --version`, `kiln-run --version` and a CPU run of an engine load
#     neither libnvrtc nor libcublasLt (LD_DEBUG=files lists what ld.so opens).
set -uo pipefail
kiln=$1 kiln_run=$2 libkiln=$3 src=$4 shared=${5:-$src/../shared}
build=$(dirname "$kiln")
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

command -v readelf >/dev/null || { echo "FAIL: readelf not found (binutils)" >&2; exit 1; }
command -v nm >/dev/null || { echo "FAIL: nm not found (binutils)" >&2; exit 1; }

needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p'; }

# Sonames the runtime-only artifacts may need: libc and friends, the small C
# libraries, and the sanitizer runtimes of a KILN_SANITIZE build.
allowed='^(libc|libm|libpthread|libdl|librt|libgcc_s|libjansson|libzstd|libxxhash|libpcre2-8|libasan|libubsan|liblsan)\.so(\.[0-9]+)*$|^ld-linux'
forbidden_rt='^(libnvrtc|libLLVM|libcuda|libcublas|libcudart|libclang)'
for f in "$kiln_run" "$libkiln"; do
    [ -f "$f" ] || { fail "$f does not exist"; continue; }
    n=$(needed "$f")
    [ -n "$n" ] || fail "$(basename "$f"): no NEEDED entries read (readelf -d failed?)"
    bad=$(grep -E "$forbidden_rt" <<<"$n")
    [ -z "$bad" ] || fail "$(basename "$f") NEEDS $(echo $bad) (the runtime must not link NVRTC, LLVM, the driver or cuBLASLt)"
    other=$(grep -Ev "$allowed" <<<"$n" | grep -Ev "$forbidden_rt")
    [ -z "$other" ] || fail "$(basename "$f") NEEDS $(echo $other), outside the allow-list in tests/linkage.sh"
    [ -n "$bad$other" ] || ok "$(basename "$f") NEEDS only: $(echo $n)"
done
n=$(needed "$kiln")
bad=$(grep -E '^(libnvrtc|libcuda|libcublas)' <<<"$n")
[ -z "$bad" ] && ok "kiln does not NEED libnvrtc, the driver or cuBLASLt" ||
    fail "kiln NEEDS $(echo $bad) (NVRTC and cuBLASLt are loaded with dlopen)"

soname=$(readelf -d "$libkiln" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
[[ $soname =~ ^libkiln\.so\.[0-9]+$ ]] && ok "libkiln.so SONAME $soname" || fail "libkiln.so SONAME is '$soname'"

# kiln-run holds no front-end code: no global symbol defined by the front
# end's static libraries is defined in kiln-run.
front_syms=$(mktemp) run_syms=$(mktemp)
trap 'rm -f "$front_syms" "$run_syms"' EXIT
found_libs=0
for lib in kiln_front kiln_passes kiln_codegen kiln_ir kiln_nvrtc; do
    a="$build/lib$lib.a"
    [ -f "$a" ] || continue
    found_libs=$((found_libs + 1))
    nm -g --defined-only "$a" 2>/dev/null | awk 'NF == 3 && $2 ~ /[TDBR]/ {print $3}' >>"$front_syms"
done
if [ "$found_libs" -lt 4 ]; then
    fail "front-end libraries not found in $build (found $found_libs)"
else
    nm --defined-only "$kiln_run" | awk 'NF == 3 && $2 ~ /[TDBR]/ {print $3}' | sort -u >"$run_syms"
    both=$(sort -u "$front_syms" | comm -12 - "$run_syms")
    [ -z "$both" ] && ok "kiln-run holds no symbol of kiln_front, kiln_passes, kiln_codegen, kiln_ir, kiln_nvrtc" ||
        fail "kiln-run holds front-end symbols: $(echo $both | head -c 400)"
fi

# libkiln.so exports kiln.h's functions, nothing more, nothing less.
api=$(grep -oE '^[a-z][a-z0-9_ ]*[ *]kiln_[a-z0-9_]+\(' "$src/runtime/kiln.h" | grep -oE 'kiln_[a-z0-9_]+' | sort -u)
exported=$(nm -D --defined-only "$libkiln" | awk '$2 ~ /[TW]/ {print $3}' | sed 's/@.*//' | sort -u)
[ "$(wc -l <<<"$api")" -ge 20 ] || fail "read only $(wc -l <<<"$api") functions from kiln.h"
diff_out=$(diff <(echo "$api") <(echo "$exported"))
[ -z "$diff_out" ] && ok "libkiln.so exports exactly kiln.h's $(wc -l <<<"$api") functions" ||
    fail "libkiln.so's exports differ from kiln.h's functions (< kiln.h only, > exported only; cmake/libkiln.map):
$diff_out"

# At run time: --version and a CPU run never load NVRTC or cuBLASLt.
loads() { LD_DEBUG=files "$@" 2>&1 >/dev/null | grep -oE 'file=[^ ]*(nvrtc|cublasLt)[^ ]*' | sort -u; }
for cmd in "$kiln --version" "$kiln_run --version"; do
    l=$(loads $cmd)
    [ -z "$l" ] && ok "'$(basename $cmd)' loads neither NVRTC nor cuBLASLt" || fail "'$cmd' loads $(echo $l)"
done
if [ -d "$shared/models/stories260k" ]; then
    eng=$(mktemp -d)/s.kiln
    if "$kiln" compile "$shared/models/stories260k" -o "$eng" --target none >/dev/null 2>&1; then
        for cmd in "$kiln_run run $eng --device cpu --prompt-ids 1,300 --max-tokens 2" "$kiln_run inspect $eng" \
                   "$kiln run $eng --device cpu --prompt-ids 1,300 --max-tokens 2" "$kiln inspect $eng"; do
            set -- $cmd
            if ! "$@" >/dev/null 2>&1; then fail "'$cmd' failed"; continue; fi
            l=$(loads "$@")
            [ -z "$l" ] && ok "'$(basename $1) $2 --device cpu' loads neither NVRTC nor cuBLASLt" || fail "'$cmd' loads $(echo $l)"
        done
    else
        fail "kiln compile of stories260k failed"
    fi
    rm -rf "$(dirname "$eng")"
else
    echo "skip: $shared/models/stories260k not found (run-time load checks)"
fi

[ "$fails" -eq 0 ] || { echo "linkage: $fails check(s) failed" >&2; exit 1; }
echo "linkage: all checks passed"

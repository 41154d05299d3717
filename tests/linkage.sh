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
allowed='^(libc|libm|libpthread|libdl|librt|libgcc_s|libjansson|libzstd|libxxhash|libpcre2-8|libmicrohttpd|libasan|libubsan|liblsan)\.so(\.[0-9]+)*$|^ld-linux'
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

for f in "$kiln_run" "$libkiln"; do
    readelf -d "$f" | grep -q 'RUNPATH.*\$ORIGIN' && ok "$(basename "$f") RUNPATH has \$ORIGIN (a libcublasLt beside it is found)" ||
        fail "$(basename "$f") has no \$ORIGIN in its RUNPATH"
done
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
api=$(cat "$src/runtime/kiln.h" "$src/common/kiln_status.h" | grep -oE '^[a-z][a-z0-9_ ]*[ *]kiln_[a-z0-9_]+\(' | sed -E 's/.*[ *](kiln_[a-z0-9_]+)\($/\1/' |
      sort -u)
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
# With the toolkit's library folders hidden (a mount namespace with an empty
# tmpfs over each folder holding libnvrtc or libcublasLt): kiln and kiln-run
# start, inspect and run on the CPU; kiln compile with kernels fails with a
# message that names libnvrtc and gives a hint. Skipped where unshare is not
# allowed.
hidden_toolkit_checks() {
    local eng=$1 dirs
    dirs=$( (ldconfig -p 2>/dev/null | grep -E 'lib(nvrtc|cublasLt)\.so' | sed 's/.*=> //'
             ls /usr/local/cuda/lib*/lib{nvrtc,cublasLt}.so* 2>/dev/null) |
           xargs -r -n1 readlink -f | xargs -r -n1 dirname | sort -u)
    if [ -z "$dirs" ]; then echo "skip: no CUDA toolkit library folder to hide"; return; fi
    local us=
    for u in "unshare -rm" "unshare -m"; do
        if $u true 2>/dev/null; then us=$u; break; fi
    done
    if [ -z "$us" ]; then echo "skip: unshare -m not allowed here (toolkit-hidden checks)"; return; fi
    local out
    out=$($us bash -s "$kiln" "$kiln_run" "$eng" $dirs <<'HIDDEN' 2>&1
kiln=$1 kiln_run=$2 eng=$3; shift 3
for d in "$@"; do mount -t tmpfs none "$d" || { echo "FAIL: cannot hide $d"; exit 0; }; done
echo "hidden: $*"
for cmd in "$kiln --version" "$kiln_run --version" "$kiln_run inspect $eng" "$kiln inspect $eng" \
           "$kiln_run run $eng --device cpu --prompt-ids 1,300 --max-tokens 2" \
           "$kiln run $eng --device cpu --prompt-ids 1,300 --max-tokens 2"; do
    set -- $cmd
    if "$@" >/dev/null 2>/tmp/kiln-linkage-err.$$; then echo "ok: hidden toolkit: '${1##*/} $2' works"
    else echo "FAIL: hidden toolkit: '$cmd': $(head -3 /tmp/kiln-linkage-err.$$)"; fi
done
rm -f /tmp/kiln-linkage-err.$$
HIDDEN
)
    echo "$out" | grep -v '^FAIL' || true
    while IFS= read -r line; do fail "${line#FAIL: }"; done < <(echo "$out" | grep '^FAIL')
    # kernel compilation with the toolkit hidden: an error naming libnvrtc with a hint
    if grep -qa 'which compiling kernels needs' "$kiln" && [ -n "$ckpt" ]; then  # a kiln built with NVRTC
        local msg
        msg=$($us bash -c 'for d in "${@:4}"; do mount -t tmpfs none "$d"; done; "$1" compile "$2" -o "$3" --target sm_90 2>&1' \
              _ "$kiln" "$ckpt" "$(dirname "$eng")/k.kiln" $dirs)
        if grep -q 'libnvrtc' <<<"$msg" && grep -q 'hint:' <<<"$msg"; then
            ok "hidden toolkit: kiln compile --target sm_90 says: $(grep -m1 libnvrtc <<<"$msg" | cut -c1-160)"
        else
            fail "hidden toolkit: kiln compile --target sm_90 did not name libnvrtc with a hint: $(echo $msg | cut -c1-300)"
        fi
    fi
}

ckpt=
if [ -d "$shared/models/stories260k" ]; then
    ckpt=$shared/models/stories260k
    eng=$(mktemp -d)/s.kiln
    if "$kiln" compile "$shared/models/stories260k" -o "$eng" --target none >/dev/null 2>&1; then
        for cmd in "$kiln_run run $eng --device cpu --prompt-ids 1,300 --max-tokens 2" "$kiln_run inspect $eng" \
                   "$kiln run $eng --device cpu --prompt-ids 1,300 --max-tokens 2" "$kiln inspect $eng"; do
            set -- $cmd
            if ! "$@" >/dev/null 2>&1; then fail "'$cmd' failed"; continue; fi
            l=$(loads "$@")
            [ -z "$l" ] && ok "'$(basename $1) $2' on the CPU loads neither NVRTC nor cuBLASLt" || fail "'$cmd' loads $(echo $l)"
        done
        hidden_toolkit_checks "$eng"
    else
        fail "kiln compile of stories260k failed"
    fi
    rm -rf "$(dirname "$eng")"
else
    echo "skip: $shared/models/stories260k not found (run-time load checks)"
fi

[ "$fails" -eq 0 ] || { echo "linkage: $fails check(s) failed" >&2; exit 1; }
echo "linkage: all checks passed"

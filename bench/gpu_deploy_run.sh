#!/usr/bin/env bash
# gpu_deploy_run.sh — one device session for issue 11 (runtime-only
# artifacts): kiln-run, and libkiln.so through docs/examples/generate.c,
# generate on the GPU with the CUDA toolkit's library folders hidden — only
# the driver (libcuda.so.1, outside the toolkit) and a copy of
# libcublasLt.so.13 beside the binary are visible. About 2 minutes on one H200.
#
# On the build machine (Release, with CUDA), then carry the folder:
#     cmake -S . -B build-rel -DCMAKE_BUILD_TYPE=Release -DKILN_TESTS=OFF && cmake --build build-rel -j2
#     mkdir -p .carry/deploy/bin && cp -a build-rel/kiln build-rel/kiln-run build-rel/libkiln.so* \
#         build-rel/kiln_example_generate .carry/deploy/bin/
# On the GPU machine, from the repository root:
#     BIN=.carry/deploy/bin bash bench/gpu_deploy_run.sh
# Steps: compile models/kjv-tiny (bf16, tokenizer; TEXT_MODEL= another) and
# models/stories260k (f32) for sm_90
# with the toolkit visible (the build-machine step); make a production folder
# with kiln-run, libkiln.so.0, generate and libcublasLt.so.13; then in a
# mount namespace (unshare -m, else unshare -rm) mount an empty tmpfs over
# every folder holding libnvrtc, libcublas(Lt) or libcudart, and run there. $OUT/summary.txt has a CHECK
# line per claim (PASS/FAIL) and the logs sit beside it.
set -u
BIN=${BIN:-build-rel}
TEXT_MODEL=${TEXT_MODEL:-models/kjv-tiny}
PROMPT=${PROMPT:-And God said}
OUT=${OUT:-out}
W=${W:-/tmp/kiln-deploy}
mkdir -p "$OUT" "$W"
OUT=$(cd "$OUT" && pwd) BIN=$(cd "$BIN" && pwd) TEXT_MODEL=$(cd "$TEXT_MODEL" && pwd) STORIES=$(cd models/stories260k && pwd)
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/kiln-cache}
: >"$OUT/summary.txt"
note() { echo "$1" | tee -a "$OUT/summary.txt"; }
check() { if eval "$2"; then note "CHECK PASS: $1"; else note "CHECK FAIL: $1"; fi; }

# 1. the build-machine step: engines, with NVRTC visible
"$BIN/kiln" compile "$TEXT_MODEL" -o "$W/text.kiln" --target sm_90 >"$OUT/compile.log" 2>&1
check "kiln compile $(basename "$TEXT_MODEL") --target sm_90 (toolkit visible)" '[ -s "$W/text.kiln" ]'
"$BIN/kiln" compile "$STORIES" -o "$W/stories.kiln" --target sm_90 >>"$OUT/compile.log" 2>&1
check "kiln compile stories260k --target sm_90" '[ -s "$W/stories.kiln" ]'

# 2. the production folder: kiln-run, libkiln, generate, libcublasLt (a copy)
P=$W/prod
rm -rf "$P" "$W/nolt" && mkdir -p "$P" "$W/nolt"
cp -a "$BIN/kiln-run" "$BIN"/libkiln.so* "$BIN/kiln_example_generate" "$P/"
cp -a "$BIN/kiln-run" "$W/nolt/"
lt=$( (ldconfig -p | sed -n 's/.*libcublasLt\.so\.13 .*=> //p'; ls /usr/local/cuda/lib64/libcublasLt.so.13 \
       /usr/local/cuda/targets/x86_64-linux/lib/libcublasLt.so.13 2>/dev/null) | head -1)
cp -L "$lt" "$P/libcublasLt.so.13"
check "libcublasLt.so.13 copied beside kiln-run (from $lt)" '[ -s "$P/libcublasLt.so.13" ]'
for f in "$P/kiln-run" "$P/libkiln.so.0" "$BIN/kiln"; do
    note "NEEDED $(basename "$f"): $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p' | tr '\n' ' ')"
done
check "kiln-run and libkiln.so NEED no CUDA library" \
    '! readelf -d "$P/kiln-run" "$P/libkiln.so.0" | grep -E "NEEDED.*(cuda|cublas|nvrtc|LLVM)"'

# 3. the toolkit's library folders, hidden in a mount namespace
# (the folders holding NVRTC, cuBLAS(Lt) or the runtime, not the toolkit's
# root: a forward-compatibility driver in /usr/local/cuda/compat stays visible)
hide=$( (ldconfig -p | grep -E 'lib(nvrtc|cublas|cublasLt|cudart)\.so' | sed 's/.*=> //'
         ls /usr/local/cuda/lib64/lib{nvrtc,cublas,cublasLt,cudart}.so* \
            /usr/local/cuda/targets/*/lib/lib{nvrtc,cublas,cublasLt,cudart}.so* 2>/dev/null) |
       xargs -r -n1 readlink -f | xargs -r -n1 dirname | sort -ur)
note "hiding: $(echo $hide)"
us="unshare -m"
$us true 2>/dev/null || us="unshare -rm"
$us bash -s "$BIN" "$P" "$W" "$OUT" "$STORIES" "$PROMPT" $hide <<'INSIDE'
BIN=$1 P=$2 W=$3 OUT=$4 STORIES=$5 PROMPT=$6; shift 6
for d in "$@"; do mount -t tmpfs none "$d"; done
note() { echo "$1" | tee -a "$OUT/summary.txt"; }
check() { if eval "$2"; then note "CHECK PASS: $1"; else note "CHECK FAIL: $1"; fi; }
nv=$(ldconfig -p | sed -n 's/.*libnvrtc\.so\.13 .*=> //p' | head -1)
check "toolkit hidden: no libnvrtc.so.13 file, no libcublasLt.so.13 outside $P" \
    '[ ! -e "${nv:-/nonexistent}" ] && ! ldconfig -p | sed -n "s/.*libcublasLt.so.13 .*=> //p" | xargs -r ls 2>/dev/null | grep -q .'
rss() { [ -x /usr/bin/time ] || { echo n/a; return; }
        /usr/bin/time -v "$@" 2>&1 >/dev/null | sed -n 's/.*Maximum resident set size (kbytes): //p'; }
note "peak RSS kiln --version: $(rss "$BIN/kiln" --version) kB; kiln-run --version: $(rss "$P/kiln-run" --version) kB"
check "kiln-run --version" '"$P/kiln-run" --version >>"$OUT/hidden.log" 2>&1'
check "kiln --version" '"$BIN/kiln" --version >>"$OUT/hidden.log" 2>&1'
check "kiln-run run the text model on the GPU (text prompt)" \
    '"$P/kiln-run" run "$W/text.kiln" --device gpu --prompt "$PROMPT" --max-tokens 40 --temperature 0 --json \
        >"$OUT/run_text.json" 2>"$OUT/run_text.err" && grep -q "\"device\":\"gpu\"" "$OUT/run_text.json"'
check "kiln-run run stories260k on the GPU: HF greedy ids" \
    '"$P/kiln-run" run "$W/stories.kiln" --device gpu --prompt-ids 1 --max-tokens 10 --json >"$OUT/run_stories.json" \
        2>&1 && grep -q "\"ids\":\[461,461,401,401,401,461,378,455,473,456\]" "$OUT/run_stories.json"'
LD_DEBUG=files "$P/kiln-run" run "$W/text.kiln" --device gpu --prompt-ids 1,2,3,4,5,6,7,8,9,10,11,12 --max-tokens 4 \
    2>&1 >/dev/null | grep -oE 'file=[^ ]*(libcuda|cublas|nvrtc|cudart)[^ ]*' | sort -u >"$OUT/loaded.txt"
note "loaded by a GPU run: $(tr '\n' ' ' <"$OUT/loaded.txt")"
check "a GPU run loads cuBLASLt from beside kiln-run and no NVRTC" \
    'grep -q "file=$P/libcublasLt.so.13" "$OUT/loaded.txt" && ! grep -q nvrtc "$OUT/loaded.txt"'
check "kiln-run bench on the GPU (batch 8, 128/64; cuBLASLt prefill)" \
    '"$P/kiln-run" bench "$W/text.kiln" --device gpu --batch 8 --input-len 128 --output-len 64 --reps 1 --json \
        >"$OUT/bench.jsonl" 2>"$OUT/bench.err"'
check "libkiln.so (generate.c) on the GPU" \
    'LD_LIBRARY_PATH=$P "$P/kiln_example_generate" "$W/stories.kiln" --device gpu --max-tokens 10 1 \
        >"$OUT/generate.out" 2>&1 && grep -qx "\[1\] 461 461 401 401 401 461 378 455 473 456" "$OUT/generate.out"'
"$W/nolt/kiln-run" run "$W/text.kiln" --device gpu --prompt-ids 1,2 --max-tokens 2 >"$OUT/nolt.log" 2>&1
check "without libcublasLt: --device gpu fails naming libcublasLt.so.13 with a hint" \
    'grep -q "libcublasLt.so.13" "$OUT/nolt.log" && grep -q "hint:" "$OUT/nolt.log"'
check "without libcublasLt: --device auto fails too (no silent CPU fallback)" \
    '! "$W/nolt/kiln-run" run "$W/text.kiln" --device auto --prompt-ids 1,2 --max-tokens 2 >>"$OUT/nolt.log" 2>&1'
check "without libcublasLt: --device cpu works" \
    '"$W/nolt/kiln-run" run "$W/text.kiln" --device cpu --prompt-ids 1,2 --max-tokens 2 >>"$OUT/nolt.log" 2>&1'
"$BIN/kiln" compile "$STORIES" -o "$W/x.kiln" >"$OUT/compile_hidden.log" 2>&1
check "kiln compile with the toolkit hidden fails naming libnvrtc.so.13 with a hint" \
    'grep -q "libnvrtc.so.13" "$OUT/compile_hidden.log" && grep -q "hint:" "$OUT/compile_hidden.log"'
check "kiln inspect and kiln run --device cpu with the toolkit hidden" \
    '"$BIN/kiln" inspect "$W/text.kiln" >/dev/null 2>&1 && "$BIN/kiln" run "$W/stories.kiln" --device cpu --prompt-ids 1 \
        --max-tokens 4 >/dev/null 2>&1'
INSIDE
echo "$(grep -c "CHECK FAIL" "$OUT/summary.txt") check(s) failed (summary: $OUT/summary.txt)"

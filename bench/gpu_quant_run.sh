#!/usr/bin/env bash
# gpu_quant_run.sh — issue 12's GPU checks in one device call, in the order that matters:
#   kernels   test_gpu_kernels: the quantized GEMV (q8, q4g32/64/128; every epilogue, the folded
#             norm, M = 1..8) and the dequant kernel against common/quant.c, then the bf16 GEMVs
#   exec      test_gpu_exec: tiny-mistral int8 and int4g32 engines on the GPU against their HF
#             goldens (test_quant_goldens), and the bf16 one
#   ppl       each engine in $ENGINES (compiled on the build machine, e.g. pycode-22m with --quant):
#             kiln perplexity on the CPU and on the GPU over $EVAL (--bos --window 2047)
#   bench     Mistral-7B shapes, random weights (bench/make_checkpoint.py), compiled bf16, int8 and
#             int4 (g128, --quant-method rtn: speed does not depend on the range search): kiln bench
#             decode at batch 1 (and $BATCHES), GPU alone, once per item of $MEASURES (default, or
#             --measure specs such as qgemv_cc=0: an A/B in one call)
#   full      the whole test_gpu_kernels and test_gpu_exec if time is left
# Every part has a timeout; the whole run stays under $BUDGET seconds (default 540).
# Run from the repository root with the binaries in $BIN (kiln, test_gpu_kernels, test_gpu_exec):
#   BIN=.carry/bin ENGINES=.carry/q EVAL=.carry/q/eval30k.txt OUT=$OUT bash bench/gpu_quant_run.sh
# $OUT gets summary.txt, env.txt, one log per part and bench.jsonl, ppl.jsonl.
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
BUDGET=${BUDGET:-540}
ENGINES=${ENGINES:-}
EVAL=${EVAL:-}
QUANTS=${QUANTS:-none int8 int4}
BATCHES=${BATCHES:-1}
MEASURES=${MEASURES:-default} # each bench once per item: "default" or a --measure spec (A/B in one call)
W=${WORK:-/tmp/kiln-quant}
. bench/gpu_lib.sh

# the 7B checkpoint is drawn on the GPU (seconds) and compiled while the tests run
(
    timeout 100 python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/m7" || exit 1
    for q in $QUANTS; do
        if [ "$q" = none ]; then
            timeout 90 "$BIN/kiln" compile "$W/m7" -o "$W/m7-$q.kiln" --target sm_90
        else
            qm=(--quant-method rtn) # int4's range search changes the values, not the speed; fp8 has none
            [ "$q" = fp8 ] && qm=()
            timeout 150 "$BIN/kiln" compile "$W/m7" -o "$W/m7-$q.kiln" --target sm_90 --quant "$q" "${qm[@]}"
        fi
    done
) >"$OUT/m7_build.log" 2>&1 &
build=$!

part kernels 150 env KILN_TEST_ONLY=test_gemv_quant,test_gemv_fp8_codes,test_gemv,test_gemv_norm "$BIN/test_gpu_kernels"
part exec 150 env KILN_TEST_ONLY=test_quant_goldens,test_tiny_bf16 "$BIN/test_gpu_exec"
if [ -n "$ENGINES" ] && [ -n "$EVAL" ]; then
    for e in "$ENGINES"/*.kiln; do
        for dev in cpu gpu; do
            n=ppl_$(basename "$e" .kiln)_$dev
            part "$n" 90 "$BIN/kiln" perplexity "$e" --text-file "$EVAL" --bos --window 2047 --device $dev --json
            grep '^{' "$OUT/$n.log" | sed "s|^{|{\"engine\": \"$(basename "$e")\", |" >>"$OUT/ppl.jsonl"
        done
    done
fi
wait $build
echo "m7_build: rc $?, at $((SECONDS - t0)) s: $(grep -h 'wrote\|error' "$OUT/m7_build.log" | tr '\n' ' ')" | tee -a "$S"
for q in $QUANTS; do
    for b in $BATCHES; do
        for mk in $MEASURES; do
            [ -f "$W/m7-$q.kiln" ] && [ "$(left)" -gt 40 ] || continue
            n=bench_${q}_b${b}_${mk//[=,]/_}
            if [ "$mk" = default ]; then ma=(); else ma=(--measure "$mk"); fi
            part "$n" 60 "$BIN/kiln" bench "$W/m7-$q.kiln" --batch "$b" --input-len 128 --output-len 128 \
                --reps 3 --json "${ma[@]}"
            grep '^{' "$OUT/$n.log" | sed "s|^{|{\"quant\": \"$q\", \"measure\": \"$mk\", |" >>"$OUT/bench.jsonl"
        done
    done
done
[ "$(left)" -gt 100 ] && part full_kernels $(($(left) / 2)) "$BIN/test_gpu_kernels"
[ "$(left)" -gt 60 ] && part full_exec $(($(left) - 10)) "$BIN/test_gpu_exec"
echo "total: $((SECONDS - t0)) s" | tee -a "$S"

#!/usr/bin/env bash
# gpu_q4cc_check.sh — the q4 CUDA-core GEMV for one-token steps (gemv.cuh kiln_gemv_ccq4, module
# variant "<dtype>.ck"; issue 12's int4 decode) in one device call:
#   kernels  test_gpu_kernels test_gemv_quant (q4g32/64/128 on CUDA cores in both widenings, beside the
#            tensor cores and q8/fp8) and $KERNEL_TESTS
#   exec     test_gpu_exec $EXEC_TESTS (the kernels section's .ck modules, the int4 tiny-mistral engines
#            against their HF goldens, now through the CUDA-core GEMV at one token)
#   bench    Mistral-7B shapes (random weights, bench/make_checkpoint.py) compiled --quant int4 (g128,
#            --quant-method rtn) and, with $QUANTS, more: kiln bench decode at batch 1 (two rounds) and 8
#            (one), the default (the .ck GEMV) and --measure qgemv_cc=0 (the tensor cores) alternating;
#            FOLD=1 adds int4 compiled with the opt-in pass fold-norm-into-gemv, at batch 1
#   ppl      with $PPL_ENGINE and $EVAL (an engine compiled on the build machine, e.g. pycode-22m --quant
#            int4, and a text): kiln perplexity on the GPU, one window at a time (one-token steps), with
#            the CUDA-core GEMV and with the tensor cores (--measure qgemv_cc=0), to set against the CPU's
#   profile  kiln bench --profile of the int4 engine at batch 1
#   micro    kiln_gpu_bench --quant: every GEMV variant over the decode shapes (when $MICRO = 1), after
#            the kernel tests, while the engines compile
# Run from the repository root with the binaries in $BIN ($SKIP_KERNELS=1 leaves the kernel tests out):
#   BIN=.carry/bin OUT=$OUT [PPL_ENGINE=.carry/q/pc-int4.kiln EVAL=.carry/q/eval30k.txt] bash bench/gpu_q4cc_check.sh
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
BUDGET=${BUDGET:-560}
QUANTS=${QUANTS:-int4}
MICRO=${MICRO:-1}
W=${WORK:-/tmp/kiln-q4cc}
. bench/gpu_lib.sh
K=$BIN/kiln
PASSES_FOLD=fuse-add-rmsnorm,fuse-qkv-rope,fuse-gate-up-swiglu,fuse-linear-residual,pack-weights,decode-attention-rope,fold-norm-into-gemv,dce
(
    timeout 150 python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/m7" || exit 1
    for q in $QUANTS; do
        timeout 150 "$K" compile "$W/m7" -o "$W/m7-$q.kiln" --target sm_90 --quant "$q" --quant-method rtn
    done
    # FOLD=1: int4 again with the opt-in fold-norm-into-gemv pass (the norms in the GEMVs' prologues)
    [ "${FOLD:-0}" = 1 ] && timeout 150 "$K" compile "$W/m7" -o "$W/m7-int4fold.kiln" --target sm_90 --quant int4 \
        --quant-method rtn --passes "$PASSES_FOLD"
    rm -rf "$W/m7"
) >"$OUT/build.log" 2>&1 &
build=$!
[ "${SKIP_KERNELS:-0}" = 1 ] || part kernels 150 env KILN_TEST_ONLY=test_gemv_quant${KERNEL_TESTS:+,$KERNEL_TESTS} "$BIN/test_gpu_kernels"
[ "$MICRO" = 1 ] && part micro 150 "$BIN/kiln_gpu_bench" --quant
part exec 200 env KILN_TEST_ONLY=${EXEC_TESTS:-test_kernels_section_quant,test_quant_goldens} "$BIN/test_gpu_exec"
if [ -n "${PPL_ENGINE:-}" ] && [ -n "${EVAL:-}" ]; then # one window at a time: one-token steps, the GEMV
    for mk in qgemv_cc=1 qgemv_cc=0; do
        part "ppl_${mk//=/_}" 90 "$K" perplexity "$PPL_ENGINE" --text-file "$EVAL" --bos --window 2047 --batch 1 \
            --device gpu --json --measure "$mk"
        grep '^{' "$OUT/ppl_${mk//=/_}.log" | sed "s|^{|{\"measure\": \"$mk\", |" >>"$OUT/ppl.jsonl"
    done
fi
wait $build
echo "build: $(grep -h 'wrote\|error' "$OUT/build.log" | tr '\n' ' ')" >>"$S"
for round in 1 2; do
    for q in $QUANTS; do
        for b in 1 $([ $round = 1 ] && echo 8); do
            b1 "${q}_b${b}_cc_$round" 50 "$W/m7-$q.kiln" --batch $b --input-len 128 --output-len 128 --reps 3
            b1 "${q}_b${b}_tc_$round" 50 "$W/m7-$q.kiln" --batch $b --input-len 128 --output-len 128 --reps 3 \
                --measure qgemv_cc=0
        done
    done
    [ "${FOLD:-0}" = 1 ] && b1 "int4fold_b1_cc_$round" 50 "$W/m7-int4fold.kiln" --batch 1 --input-len 128 --output-len 128 --reps 3
done
b1 "int4_b1_profile" 60 "$W/m7-int4.kiln" --batch 1 --input-len 128 --output-len 128 --reps 1 --profile
grep -h '"metric":"decode_tokens_per_s"' "$OUT"/bench.jsonl | sed 's/.*"run": "\([^"]*\)".*"value":\([0-9.]*\).*/\1 \2/' >>"$S"
echo "total: $((SECONDS - t0)) s" | tee -a "$S"

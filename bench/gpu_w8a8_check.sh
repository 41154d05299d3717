#!/usr/bin/env bash
# gpu_w8a8_check.sh — FP8 W8A8 (issue 12) in one device call:
#   kernels  test_gpu_kernels test_w8a8 (kiln_act_fp8 bit-exact against quant.c, cuBLASLt's FP8 GEMM
#            against the codes in double) and the fp8 GEMV tests
#   exec     test_gpu_exec's quantized goldens (the fp8 engines among them)
#   ppl      $PPL_ENGINE (an fp8 engine made on the build machine) on the GPU over $EVAL, once per
#            --measure spec of $PPL_MEASURES: kiln perplexity scores with decode steps of --batch
#            windows, so gemv_max_m=1 sends them through the GEMMs, W8A8 (default) or dequantized
#            (w8a8=0), and gemv_max_m=1,... beside "default" (the GEMV, weight-only) compares them
#   bench    Mistral-7B shapes (random weights, bench/make_checkpoint.py), bf16 and --quant fp8:
#            prefill of 2048 tokens and decode at $BATCHES (128 in / 128 out), fp8 with and without
#            W8A8; a --profile of the fp8 prefill; then Llama-3.1-8B shapes --quant fp8 at $LBATCHES
#   block    with BLOCK=1 (instead of bench): Mistral-7B shapes as a block-FP8 checkpoint (fp8g128),
#            prefill of 2048 and 2047 tokens (rows not a multiple of 4: the padded steps) and decode at
#            batch 64 and 61, W8A8 with 128-column scales (the default; --measure w8a8=2 says it) against
#            dequantized (w8a8=1), and the gemm_fp8_matrices each run reports
# SKIP_KERNELS=1 leaves out the kernel tests; EXEC_TESTS names test_gpu_exec's tests (KILN_TEST_ONLY)
# Run from the repository root with the binaries in $BIN:
#   BIN=.carry/bin PPL_ENGINE=.carry/q/pycode-fp8.kiln EVAL=.carry/q/eval.txt OUT=$OUT bash bench/gpu_w8a8_check.sh
#   BLOCK=1 BIN=.carry/bin OUT=$OUT bash bench/gpu_w8a8_check.sh      # the tests, then the block part
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
BUDGET=${BUDGET:-570}
BATCHES=${BATCHES:-1 64}
LBATCHES=${LBATCHES:-256 512 1024}
W=${WORK:-/tmp/kiln-w8a8}
. bench/gpu_lib.sh
val() { grep "\"$1\"" | tail -1 | sed 's/.*"value":\([0-9.e+-]*\).*/\1/'; }
K=$BIN/kiln
(
    [ "${BLOCK:-0}" = 1 ] && exit 0 # the block part makes its own checkpoint
    timeout 120 python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/m7" || exit 1
    timeout 90 "$K" compile "$W/m7" -o "$W/m7-bf16.kiln" --target sm_90
    timeout 120 "$K" compile "$W/m7" -o "$W/m7-fp8.kiln" --target sm_90 --quant fp8
    rm -rf "$W/m7"
    timeout 140 python3 bench/make_checkpoint.py --arch llama-3.1-8b --out "$W/l8" || exit 1
    timeout 140 "$K" compile "$W/l8" -o "$W/l8-fp8.kiln" --target sm_90 --quant fp8
    rm -rf "$W/l8"
) >"$OUT/build.log" 2>&1 &
build=$!
[ "${SKIP_KERNELS:-0}" = 1 ] || part kernels 150 env KILN_TEST_ONLY=test_w8a8,test_gemv_fp8_codes,test_gemv_quant,test_cublaslt_tune \
    "$BIN/test_gpu_kernels"
part exec 150 env KILN_TEST_ONLY=${EXEC_TESTS:-test_quant_goldens,test_tiny_bf16,test_stories_f32} "$BIN/test_gpu_exec"
if [ -n "${PPL_ENGINE:-}" ]; then
    for mk in ${PPL_MEASURES:-default gemv_max_m=1 gemv_max_m=1,w8a8=0}; do
        if [ "$mk" = default ]; then ma=(); else ma=(--measure "$mk"); fi
        n=ppl_${mk//[=,]/_}
        part "$n" 60 "$K" perplexity "$PPL_ENGINE" --text-file "$EVAL" --bos --window 2047 --device gpu "${ma[@]}" --json
        grep '^{' "$OUT/$n.log" | sed "s|^{|{\"measure\": \"$mk\", |" >>"$OUT/ppl.jsonl"
    done
fi
if [ "${BLOCK:-0}" = 1 ]; then
    part block_build 200 bash -c "python3 bench/make_checkpoint.py --arch mistral-7b --fp8-block 128 --out $W/m7b &&
        $K compile $W/m7b -o $W/m7b.kiln --target sm_90; rm -rf $W/m7b"
    for run in "2048 1" "2047 1" "128 64" "128 61"; do
        # shellcheck disable=SC2086 # "LEN BATCH" as two words
        set -- $run
        for mk in w8a8=2 w8a8=1; do
            if [ "$2" = 1 ]; then len=(--input-len "$1" --output-len 1); else len=(--input-len 128 --output-len 128); fi
            b1 "block_${1}_b${2}_${mk/=/}" 60 "$W/m7b.kiln" --batch "$2" "${len[@]}" --reps 3 --measure "$mk"
        done
    done
    grep -h '"gemm_fp8_matrices"\|"prefill_ms"\|"decode_tokens_per_s"' "$OUT"/block_*.log | cut -c1-160 >>"$S"
    echo "total: $((SECONDS - t0)) s" | tee -a "$S"
    exit 0
fi
while kill -0 $build 2>/dev/null && [ ! -f "$W/m7-fp8.kiln" ]; do sleep 2; done
sleep 1
for round in 1 2; do
    b1 "prefill_bf16_$round" 60 "$W/m7-bf16.kiln" --batch 1 --input-len 2048 --output-len 1 --reps 3
    b1 "prefill_fp8_$round" 60 "$W/m7-fp8.kiln" --batch 1 --input-len 2048 --output-len 1 --reps 3
    b1 "prefill_fp8_deq_$round" 60 "$W/m7-fp8.kiln" --batch 1 --input-len 2048 --output-len 1 --reps 3 --measure w8a8=0
done
b1 prefill_fp8_profile 60 "$W/m7-fp8.kiln" --batch 1 --input-len 2048 --output-len 1 --reps 2 --profile
for b in $BATCHES; do
    b1 "decode_bf16_b$b" 60 "$W/m7-bf16.kiln" --batch "$b" --input-len 128 --output-len 128 --reps 3
    b1 "decode_fp8_b$b" 60 "$W/m7-fp8.kiln" --batch "$b" --input-len 128 --output-len 128 --reps 3
    [ "$b" -gt 32 ] && b1 "decode_fp8_deq_b$b" 60 "$W/m7-fp8.kiln" --batch "$b" --input-len 128 --output-len 128 \
        --reps 3 --measure w8a8=0
done
rm -f "$W/m7-bf16.kiln"
wait $build
echo "build: $(grep -h 'wrote\|error' "$OUT/build.log" | tr '\n' ' ')" >>"$S"
for b in $LBATCHES; do
    b1 "llama8_fp8_b$b" 90 "$W/l8-fp8.kiln" --batch "$b" --input-len 128 --output-len 128 --reps 2
done
echo "total: $((SECONDS - t0)) s" | tee -a "$S"

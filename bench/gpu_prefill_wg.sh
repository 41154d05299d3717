#!/usr/bin/env bash
# gpu_prefill_wg.sh — prefill on Hopper: attention on wgmma (kiln_attn_prefill_wg) against mma.sync, and
# fp8's SwiGLU writing down_proj's E4M3 codes (pass swiglu-out-fp8) against the bf16 product quantized
# after, in one device call. The kernel tests (test_gpu_kernels $KERNEL_TESTS: every kernel against its
# CPU reference), the kernel alone (kiln_gpu_bench --prefill, with its output against mma.sync's),
# engine tests ($EXEC_TESTS), then a Mistral-7B checkpoint (random weights, drawn on the GPU by
# bench/make_checkpoint.py) compiled bf16, --quant fp8, and --quant fp8 without swiglu-out-fp8
# (fp8nos), and $ROUNDS rounds, alternating: prefill 2048 with the default (wgmma) and --measure
# prefill_wg=0 (bf16, fp8), fp8nos's (RUNS: "engine:knobs ..."); fp8's and fp8nos's decode at batch 64
# (W8A8 steps); then a --profile of each engine's prefill (its table on stdout and in the summary).
#   BIN=.carry/bin OUT=$OUT bash bench/gpu_prefill_wg.sh      (ENGINES=0: the tests and the kernel only;
#   NCU=1: Nsight Compute's view of one wgmma launch at 2048 tokens)
# $OUT gets summary.txt (one line a part and a bench), env.txt, bench.jsonl and the logs.
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-pfwg}
BUDGET=${BUDGET:-560}
ROUNDS=${ROUNDS:-2}
K=$BIN/kiln
. bench/gpu_lib.sh
part kernels 150 env KILN_TEST_ONLY=${KERNEL_TESTS:-test_attn_prefill,test_swiglu} "$BIN/test_gpu_kernels" || true
grep FAIL "$OUT/kernels.log" | head -5 >>"$S"
part kernel_bench 120 "$BIN/kiln_gpu_bench" --prefill || true
grep "prefill attention" "$OUT/kernel_bench.log" | grep -v "fp32 fma" >>"$S"
if [ "${NCU:-0}" = 1 ]; then # Nsight Compute on one T = 2048 launch of the wgmma kernel (146 launches at T = 512 first)
    part ncu 200 ncu --clock-control none -k kiln_attn_prefill_wg --launch-skip 150 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
        "$BIN/kiln_gpu_bench" --prefill
    grep -E "^ +[A-Z][A-Za-z /\(\)\.-]+ +[a-zA-Z%/]+ +[0-9.,]+$" "$OUT/ncu.log" | head -60 >>"$S"
fi
part exec 240 env KILN_TEST_ONLY=${EXEC_TESTS:-test_tiny_bf16,test_batched_and_mixed} "$BIN/test_gpu_exec" || true
grep -E "FAIL|W8A8 prefill|tp 2" "$OUT/exec.log" | head -12 >>"$S"
[ "${ENGINES:-1}" = 1 ] || exit 0
part checkpoint 150 python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/m7" || exit 0
nos="fuse-add-rmsnorm,fuse-qkv-rope,fuse-gate-up-swiglu,fuse-linear-residual,pack-weights,decode-attention-rope"
nos="$nos,dce,fold-norm-into-ck-gemv,w8a8"
part compile_bf16 90 "$K" compile "$W/m7" -o "$W/bf16.kiln" --target sm_90
part compile_fp8 90 "$K" compile "$W/m7" -o "$W/fp8.kiln" --target sm_90 --quant fp8
part compile_fp8nos 90 "$K" compile "$W/m7" -o "$W/fp8nos.kiln" --target sm_90 --quant fp8 --passes "$nos"
val() { grep -h "\"$1\"" "$2" | sed 's/.*"value":\([0-9.e+-]*\).*/\1/' | tail -1; }
for round in $(seq "$ROUNDS"); do
    for run in ${RUNS:-bf16:prefill_wg=1 bf16:prefill_wg=0 fp8:prefill_wg=1 fp8:prefill_wg=0 fp8nos:prefill_wg=1}; do
        e=${run%%:*} mk=${run#*:}
        n="r${round}_${e}_2048_${mk/=/}"
        b1 "$n" 60 "$W/$e.kiln" --batch 1 --input-len 2048 --output-len 1 --reps 3 --measure "$mk"
        echo "round $round $e prefill 2048 $mk: $(val prefill_ms "$OUT/$n.log") ms" >>"$S"
    done
    for e in fp8 fp8nos; do
        n="r${round}_${e}_b64"
        b1 "$n" 60 "$W/$e.kiln" --batch 64 --input-len 128 --output-len 128 --reps 3
        echo "round $round $e decode b64: $(val decode_tokens_per_s "$OUT/$n.log") tok/s" >>"$S"
    done
done
for e in bf16 fp8; do
    part "profile_$e" 60 "$K" bench "$W/$e.kiln" --batch 1 --input-len 2048 --output-len 1 --reps 2 --profile
    grep -A40 "^profile, prefill" "$OUT/profile_$e.log" | head -30 >>"$S"
done
echo "total: $((SECONDS - t0)) s" | tee -a "$S"

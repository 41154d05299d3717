#!/usr/bin/env bash
# gpu_verify.sh — the GPU checks issue 9's "done when" names, in one device call: test_gpu_nvrtc,
# test_gpu_kernels and test_gpu_exec whole; compute-sanitizer memcheck over the prefill attention
# (wgmma and mma.sync) and SwiGLU kernel tests and two engine tests, racecheck over the prefill attention
# test; the Mistral-7B logits against HF fp32 / bf16 at lengths 1..6000 (bench/gpu_correct_run.sh,
# PPL=0); then, on that engine, prefill of 128 tokens (time to first token) with --profile and with the
# wgmma kernel on and off. The tests run beside the logits (the GPU is shared: no timing from them).
#   BIN=.carry/bin OUT=$OUT bash bench/gpu_verify.sh
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-verify}
BUDGET=${BUDGET:-560}
K=$BIN/kiln
. bench/gpu_lib.sh
(
  part nvrtc 40 "$BIN/test_gpu_nvrtc"
  part kernels 100 "$BIN/test_gpu_kernels"
  part exec 150 "$BIN/test_gpu_exec"
  part memcheck_kernels 90 env KILN_TEST_ONLY=test_attn_prefill,test_swiglu \
    compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_gpu_kernels"
  part racecheck_prefill 70 env KILN_TEST_ONLY=test_attn_prefill \
    compute-sanitizer --tool racecheck --error-exitcode 9 "$BIN/test_gpu_kernels"
  part memcheck_exec 70 env KILN_TEST_ONLY=test_tiny_bf16,test_w8a8_matches_cpu \
    compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_gpu_exec"
  for f in kernels exec; do grep -E "FAIL" "$OUT/$f.log" | head -8 >>"$S"; done
  grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT"/memcheck_*.log "$OUT"/racecheck_*.log >>"$S"
) &
tests=$!
OUT=$OUT/correct WORK=$W PPL=0 BIN=$BIN KILN_COMMIT=${KILN_COMMIT:-unknown} bash bench/gpu_correct_run.sh \
  >"$OUT/correct.log" 2>&1
echo "correct: rc $?" >>"$S"
cat "$OUT/correct/logits.jsonl" >>"$S" 2>/dev/null
wait $tests
E=$W/m7b.kiln
val() { grep -h "\"$1\"" "$2" | sed 's/.*"value":\([0-9.e+-]*\).*/\1/' | tail -1; }
for round in 1 2; do
  for mk in prefill_wg=1 prefill_wg=0; do
    n="r${round}_ttft_${mk/=/}"
    b1 "$n" 60 "$E" --batch 1 --input-len 128 --output-len 1 --reps 5 --measure "$mk"
    echo "round $round prefill 128 $mk: $(val prefill_ms "$OUT/$n.log") ms" >>"$S"
  done
done
[ "$(left)" -gt 40 ] && part profile_128 35 "$K" bench "$E" --batch 1 --input-len 128 --output-len 1 --reps 3 --profile
grep -A40 "^profile, prefill" "$OUT/profile_128.log" | head -34 >>"$S"
echo "total: $((SECONDS - t0)) s" | tee -a "$S"
cat "$S"

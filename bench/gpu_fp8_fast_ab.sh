#!/usr/bin/env bash
# gpu_fp8_fast_ab.sh — W8A8 GEMMs with cuBLASLt's FP8 fast accumulation (`--measure w8a8_fast=1`) against
# without, in one device call: test_gpu_kernels' test_w8a8 (the fast products' errors printed) and
# test_cublaslt_tune, test_gpu_exec's W8A8 and tuning tests; the pycode-22m fp8 engine compiled here
# (.carry/eval, with the eval text) scored by `kiln perplexity` on the GPU both ways; then a Mistral-7B
# checkpoint (random weights, bench/make_checkpoint.py) compiled --quant fp8 and benched both ways,
# rounds alternating: a 2048-token prefill and decode at batch 64 (128 in / 64 out).
#   BIN=.carry/bin OUT=$OUT bash bench/gpu_fp8_fast_ab.sh
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-fp8fast}
BUDGET=${BUDGET:-570}
K=$BIN/kiln
EV=${EVAL:-.carry/eval}
. bench/gpu_lib.sh
python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/m7" >"$OUT/checkpoint.log" 2>&1 &
ck=$!
part kernels 150 env KILN_TEST_ONLY=test_w8a8,test_cublaslt_tune "$BIN/test_gpu_kernels"
grep -E "FAIL|fast accumulation" "$OUT/kernels.log" | head -30 >>"$S"
part exec 150 env KILN_TEST_ONLY=test_w8a8_matches_cpu,test_tuning_record,test_every_row_small_step "$BIN/test_gpu_exec"
grep -E "FAIL" "$OUT/exec.log" | head -8 >>"$S"
for f in 0 1; do
    part "ppl_fast$f" 120 "$K" perplexity "$EV/py-fp8.kiln" --text-file "$EV/python-stdlib-eval.txt" --device gpu \
        --measure "w8a8_fast=$f" --json
    grep '^{' "$OUT/ppl_fast$f.log" | cut -c1-200 >>"$S"
done
wait $ck || { echo "checkpoint failed" >>"$S"; cat "$S"; exit 0; }
part compile 200 "$K" compile "$W/m7" -o "$W/fp8.kiln" --target sm_90 --quant fp8
rm -rf "$W/m7"
for round in 1 2; do
    for f in 0 1; do
        n="r${round}_fast${f}_p2048"
        b1 "$n" 60 "$W/fp8.kiln" --batch 1 --input-len 2048 --output-len 4 --reps 3 --measure "w8a8_fast=$f"
        echo "round $round w8a8_fast=$f prefill 2048: $(metric_at "$n" prefill_ms 1) ms" >>"$S"
        n="r${round}_fast${f}_b64"
        b1 "$n" 60 "$W/fp8.kiln" --batch 64 --input-len 128 --output-len 64 --reps 3 --measure "w8a8_fast=$f"
        echo "round $round w8a8_fast=$f b64: decode $(metric_at "$n" decode_tokens_per_s 64) tok/s; batch 1, 128 tokens:" \
            "prefill $(metric_at "$n" prefill_ms 1) ms" >>"$S"
    done
done
echo "total: $((SECONDS - t0)) s" >>"$S"
cat "$S"
# the device tool brings back a few files only: the logs in one archive
tar -C "$OUT" -czf /tmp/kiln-logs.tgz --exclude summary.txt --exclude bench.jsonl . && mv /tmp/kiln-logs.tgz "$OUT/logs.tgz" &&
    find "$OUT" -name '*.log' -delete

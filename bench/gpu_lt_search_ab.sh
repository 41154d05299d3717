#!/usr/bin/env bash
# gpu_lt_search_ab.sh — cuBLASLt tuning's search past the heuristic (other tiles, split-K; runtime/cuda/cublaslt.c),
# in one device call:
# test_gpu_kernels' test_cublaslt_tune (a long-K shape must keep a split-K algorithm and every tuned
# GEMM match the CPU; candidates and times logged), test_gpu_exec's tuning record and goldens; then a
# Mistral-7B checkpoint (random weights, bench/make_checkpoint.py) compiled bf16 once, copied, one copy
# tuned by `kiln tune` with --search and one without (the default), for decode
# batches 8 and 64 and prefill steps of 128 and 2048 tokens; then `kiln bench` rounds alternating the
# two: batch 64 and batch 8 (128 in / 64 out: their decode, and the batch-1 prefill and time to first
# token of 128 tokens), and a 2048-token prefill. Results in $OUT/summary.txt and $OUT/bench.jsonl.
#   BIN=.carry/bin OUT=$OUT bash bench/gpu_lt_search_ab.sh
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-ltsearch}
BUDGET=${BUDGET:-570}
K=$BIN/kiln
. bench/gpu_lib.sh
python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/m7" >"$OUT/checkpoint.log" 2>&1 &
ck=$!
part lt_tune 120 env KILN_TEST_ONLY=test_cublaslt_tune KILN_LT_TUNE=2 "$BIN/test_gpu_kernels"
grep -E "FAIL|splitK [0-9]+.*pick|picked" "$OUT/lt_tune.log" | head -12 >>"$S"
part exec 150 env KILN_TEST_ONLY=test_tuning_record,test_tiny_goldens,test_every_row_small_step "$BIN/test_gpu_exec"
grep -E "FAIL|tuned:|reloaded" "$OUT/exec.log" | head -8 >>"$S"
wait $ck || { echo "checkpoint failed" >>"$S"; cat "$S"; exit 0; }
part compile 120 "$K" compile "$W/m7" -o "$W/search.kiln" --target sm_90 --dtype bf16
rm -rf "$W/m7"
cp "$W/search.kiln" "$W/heur.kiln"
part tune_search 120 "$K" tune "$W/search.kiln" --batch 8,64 --prefill 128,2048 --search --log --json
part tune_heur 120 "$K" tune "$W/heur.kiln" --batch 8,64 --prefill 128,2048 --log --json
grep -E "picked|variants" "$OUT/tune_search.log" | head -60 >"$OUT/tune_search_picks.txt"
for round in 1 2; do
    for e in search heur; do
        for b in 64 8; do
            n="r${round}_${e}_b$b"
            b1 "$n" 50 "$W/$e.kiln" --batch $b --input-len 128 --output-len 64 --reps 3
            echo "round $round $e b$b: decode $(metric_at "$n" decode_tokens_per_s $b) tok/s; batch 1, 128 tokens:" \
                "prefill $(metric_at "$n" prefill_ms 1) ms, ttft $(metric_at "$n" ttft_ms 1) ms" >>"$S"
        done
        n="r${round}_${e}_p2048"
        b1 "$n" 40 "$W/$e.kiln" --batch 1 --input-len 2048 --output-len 4 --reps 3
        echo "round $round $e prefill 2048: $(metric_at "$n" prefill_ms 1) ms" >>"$S"
    done
done
echo "total: $((SECONDS - t0)) s" >>"$S"
cat "$S" "$OUT/tune_search_picks.txt"
# the device tool brings back a few files only: the logs in one archive
tar -C "$OUT" -czf /tmp/kiln-logs.tgz --exclude summary.txt --exclude bench.jsonl . && mv /tmp/kiln-logs.tgz "$OUT/logs.tgz" && \
    find "$OUT" -name '*.log' -delete

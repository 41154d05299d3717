#!/usr/bin/env bash
# gpu_kv8_check.sh — the 8-bit KV cache (--kv-dtype fp8 | int8, issue 12) in one device call:
#   kernels  test_gpu_kernels' rope_kv, decode and prefill attention tests (the bf16 cache, after the
#            kernels' changes) and test_w8a8 (fp8g128's padded rows)
#   exec     test_gpu_exec test_kv8 (GPU against the CPU executor on fp8 and int8 KV engines, the
#            compute_80 PTX build, capacity), test_tiny_bf16 and test_quant_goldens
#   bench    Mistral-7B shapes (random weights, bench/make_checkpoint.py): bf16 weights with the KV cache
#            in bf16 and in fp8 (calibrated on $CALIB tokens): decode at batch 64, 128 in / 128 out and
#            1024 in / 128 out, KV capacity in the same --kv-memory, prefill of 2048 tokens
# Run from the repository root with the binaries in $BIN:
#   BIN=.carry/bin OUT=$OUT bash bench/gpu_kv8_check.sh
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
BUDGET=${BUDGET:-560}
CALIB=${CALIB:-64}
W=${WORK:-/tmp/kiln-kv8}
. bench/gpu_lib.sh
K=$BIN/kiln
(
    timeout 150 python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/m7" || exit 1
    # random weights have no tokenizer for the built-in text: calibration ids instead
    python3 -c "print(' '.join(str((i * 7919 + 13) % 32000) for i in range($CALIB)))" >"$W/calib.ids"
    timeout 100 "$K" compile "$W/m7" -o "$W/m7-bf16.kiln" --target sm_90
    /usr/bin/time -v timeout 240 "$K" compile "$W/m7" -o "$W/m7-kv8.kiln" --target sm_90 --kv-dtype fp8 \
        --calib-ids "$W/calib.ids" --calib-tokens "$CALIB" 2>&1 | grep -v '^\s*\(Page\|Socket\|Signals\|Swaps\|File\|Average\|Exit\|Minor\|Major\|Voluntary\|Involuntary\)'
    rm -rf "$W/m7"
) >"$OUT/build.log" 2>&1 &
build=$!
[ "${SKIP_KERNELS:-0}" = 1 ] || part kernels 120 env KILN_TEST_ONLY=test_rope_kv,test_attn_decode,test_attn_prefill,test_w8a8 "$BIN/test_gpu_kernels"
part exec 200 env KILN_TEST_ONLY=${EXEC_TESTS:-test_kv8,test_tiny_bf16,test_quant_goldens} "$BIN/test_gpu_exec"
wait $build
echo "build: $(grep -h 'wrote\|error\|Elapsed\|Maximum resident' "$OUT/build.log" | tr '\n' ' ')" >>"$S"
for round in 1 2; do
    for kv in bf16 kv8; do
        b1 "decode_${kv}_b64_$round" 60 "$W/m7-$kv.kiln" --batch 64 --input-len 128 --output-len 128 --reps 3
    done
done
for kv in bf16 kv8; do
    b1 "decode_${kv}_b64_long" 70 "$W/m7-$kv.kiln" --batch 64 --input-len 1024 --output-len 128 --reps 2
    b1 "capacity_${kv}" 60 "$W/m7-$kv.kiln" --batch 256 --input-len 1024 --output-len 32 --reps 1 --kv-memory 8G
    b1 "prefill_${kv}" 60 "$W/m7-$kv.kiln" --batch 1 --input-len 2048 --output-len 1 --reps 3
done
grep -h '"decode_tokens_per_s"\|"kv_capacity_tokens"\|"max_running"\|"prefill_ms"' "$OUT"/bench.jsonl | cut -c1-170 >>"$S"
echo "total: $((SECONDS - t0)) s" | tee -a "$S"

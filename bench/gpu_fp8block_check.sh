#!/usr/bin/env bash
# gpu_fp8block_check.sh — block-FP8 checkpoints (weight_block_size [128, 128], read into fp8g128) on the
# GPU machine, in one call:
#   golden    tests/golden/make_quant_ckpt_goldens.py tiny-mistral-fp8-block (transformers is there, not
#             on the build machine): the checkpoint and its golden, copied to $OUT/golden.tgz to commit
#   kernels   test_gpu_kernels: the quantized GEMVs (fp8g128 on CUDA and tensor cores, K = 320's short
#             group) and the dequant kernel; every E4M3 code exact
#   exec      test_gpu_exec test_quant_goldens: the published checkpoints on the GPU against HF, the
#             block-FP8 one with the golden just made
#   bench     Mistral-7B shapes written as block FP8 (bench/make_checkpoint.py --fp8-block 128), and
#             with FP8_REF=1 one compiled --quant fp8 (a scale per row): kiln bench decode at each of
#             $BATCHES (default 1 8), engines alternating, $ROUNDS rounds (default 1)
#   BIN=.carry/bin OUT=$OUT bash bench/gpu_fp8block_check.sh
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-fp8block}
BUDGET=${BUDGET:-480}
. bench/gpu_lib.sh
val() { grep "\"$1\"" | tail -1 | sed 's/.*"value":\([0-9.e+-]*\).*/\1/'; }
( timeout 120 python3 bench/make_checkpoint.py --arch mistral-7b --fp8-block 128 --out "$W/m7b" &&
  timeout 90 "$BIN/kiln" compile "$W/m7b" -o "$W/fp8g128.kiln" --target sm_90 && rm -rf "$W/m7b" &&
  if [ -n "${FP8_REF:-}" ]; then # the same shapes with a scale per row, for comparison
      timeout 120 python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/m7" &&
      timeout 90 "$BIN/kiln" compile "$W/m7" -o "$W/fp8.kiln" --target sm_90 --quant fp8
  fi ) >"$OUT/m7_build.log" 2>&1 &
build=$!
part golden 120 python3 tests/golden/make_quant_ckpt_goldens.py tiny-mistral-fp8-block
tar czf "$OUT/golden.tgz" tests/data/tiny-mistral-fp8-block tests/golden/tiny-mistral-fp8-block
part kernels 150 env KILN_TEST_ONLY=test_gemv_quant,test_gemv_fp8_codes "$BIN/test_gpu_kernels"
part exec 150 env KILN_TEST_ONLY=test_quant_goldens,test_kernels_section_quant "$BIN/test_gpu_exec"
wait $build
echo "m7_build: rc $?, at $((SECONDS - t0)) s: $(grep -h 'wrote\|error' "$OUT/m7_build.log" | tr '\n' ' ')" | tee -a "$S"
"$BIN/kiln" inspect "$W/fp8g128.kiln" >"$OUT/inspect.log" 2>&1
for round in $(seq "${ROUNDS:-1}"); do
    for e in fp8g128 fp8; do
        for b in ${BATCHES:-1 8}; do
            [ -f "$W/$e.kiln" ] && [ "$(left)" -gt 30 ] || continue
            v=$(timeout 60 "$BIN/kiln" bench "$W/$e.kiln" --batch $b --input-len 128 --output-len 128 --reps 3 --json \
                2>>"$OUT/bench_err.log" | val decode_tokens_per_s)
            echo "round $round $e batch $b: ${v:-failed} tok/s" | tee -a "$S"
        done
    done
done
echo "total: $((SECONDS - t0)) s" | tee -a "$S"

#!/usr/bin/env bash
# gpu_tune_limits.sh — the GEMV token limits `kiln tune` measures (measure_limit, runtime/cuda/exec.c), in
# one device call: test_gpu_exec's test_tuning_record, then the whole test_gpu_exec; a Mistral-7B
# checkpoint (random weights, bench/make_checkpoint.py) compiled bf16, --quant int4 and --quant fp8,
# each `kiln tune --log`ged (the measured GEMMs of each bucket through the GEMV and through cuBLASLt,
# and the limits), and the bf16 engine's decode at batch 1, 8, 16 and 64 with the record and without it
# (--measure recorded=0), two rounds.
#   BIN=.carry/bin OUT=$OUT bash bench/gpu_tune_limits.sh
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-limits}
BUDGET=${BUDGET:-570}
K=$BIN/kiln
. bench/gpu_lib.sh
python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/m7" >"$OUT/checkpoint.log" 2>&1 &
ck=$!
part tuning_record 90 env KILN_TEST_ONLY=test_tuning_record "$BIN/test_gpu_exec"
grep -E "FAIL|measured|GEMMs of|tuned:|reloaded" "$OUT/tuning_record.log" | head -24 >>"$S"
part exec 120 "$BIN/test_gpu_exec"
grep FAIL "$OUT/exec.log" | head -5 >>"$S"
wait $ck || { echo "checkpoint failed" >>"$S"; cat "$S"; exit 0; }
part compile_bf16 90 "$K" compile "$W/m7" -o "$W/bf16.kiln" --target sm_90
part compile_int4 150 "$K" compile "$W/m7" -o "$W/int4.kiln" --target sm_90 --quant int4 --quant-method rtn
part compile_fp8 120 "$K" compile "$W/m7" -o "$W/fp8.kiln" --target sm_90 --quant fp8
for e in bf16 int4 fp8; do
  part "tune_$e" 90 "$K" tune "$W/$e.kiln" --log
  grep -E "GEMMs of|limit|thresholds|shapes in" "$OUT/tune_$e.log" | head -16 | sed "s/^/$e: /" >>"$S"
done
val() { grep -h "\"$1\"" "$2" | sed 's/.*"value":\([0-9.e+-]*\).*/\1/' | tail -1; }
for round in 1 2; do
  for mk in recorded=1 recorded=0; do
    for b in 1 8 16 64; do
      n="r${round}_b${b}_${mk/=/}"
      b1 "$n" 40 "$W/bf16.kiln" --batch $b --input-len 128 --output-len 128 --reps 3 --measure "$mk"
      echo "round $round bf16 b$b $mk: $(val decode_tokens_per_s "$OUT/$n.log") tok/s" >>"$S"
    done
  done
done
echo "total: $((SECONDS - t0)) s" >>"$S"
cat "$S"

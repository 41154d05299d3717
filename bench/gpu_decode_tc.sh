#!/usr/bin/env bash
# gpu_decode_tc.sh — decode attention on the tensor cores (kiln_attn_decode_tc, attn_decode.cuh) in one
# device call:
#   tests   test_gpu_kernels' decode attention tests (bf16 and FP8 caches, both kernels) and the prefill
#           attention test; all of test_gpu_exec
#   bench   a Llama-3.1-8B-shaped checkpoint (random weights, bench/make_checkpoint.py) compiled --quant fp8
#           --kv-dtype fp8 (KV scales from 64 random ids) and bf16; rounds alternating the default (the
#           tensor-core kernel) with `--measure decode_tc=0` (the CUDA-core one) on the same engines: fp8 end
#           to end at batch 1024 (issue 12), bf16 at batch 256 (issue 9's decode step), 1 and 8; 128 in / 128
#           out; the fp8 engine at $FP8_SMALL (default 1 8 64) with `decode_tc=2` (the tensor-core kernel
#           at every batch, the default taking it from 64 sequences) against `decode_tc=0`; then a --profile
#           of the fp8 engine at batch 1024 each way
#   BIN=.carry/bin OUT=$OUT bash bench/gpu_decode_tc.sh        # SKIP_TESTS=1: the benches only;
#   SKIP_ROUNDS=1: only the fp8 engine's $FP8_SMALL batches (and the profiles: PROFILES= for none)
# (KERNEL_TESTS, EXEC_TESTS: KILN_TEST_ONLY lists for the two test binaries; PROFILES: tc, cc or both)
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-dtc}
BUDGET=${BUDGET:-570}
K=$BIN/kiln
. bench/gpu_lib.sh
python3 bench/make_checkpoint.py --arch llama-3.1-8b --out "$W/l8" >"$OUT/checkpoint.log" 2>&1 &
ck=$!
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    part kernels 150 env KILN_TEST_ONLY=${KERNEL_TESTS:-test_attn_decode,test_attn_decode_kv8,test_attn_prefill} "$BIN/test_gpu_kernels"
    grep -E "FAIL" "$OUT/kernels.log" | head -10 >>"$S"
    part exec 150 env KILN_TEST_ONLY=${EXEC_TESTS:-} "$BIN/test_gpu_exec"
    grep -E "FAIL" "$OUT/exec.log" | head -10 >>"$S"
fi
wait $ck || { echo "checkpoint failed" >>"$S"; cat "$S"; exit 0; }
python3 -c 'import random; random.seed(7); print([random.randrange(128000) for _ in range(64)])' >"$W/calib.json"
part compile_fp8 150 "$K" compile "$W/l8" -o "$W/fp8.kiln" --target sm_90 --quant fp8 --kv-dtype fp8 --calib-ids "$W/calib.json"
part compile_bf16 120 "$K" compile "$W/l8" -o "$W/bf16.kiln" --target sm_90
rm -rf "$W/l8"
knob() { # the kernel a variant names: tc (the default), cc (decode_tc=0) or all (decode_tc=2)
    case $1 in cc) echo "--measure decode_tc=0" ;; all) echo "--measure decode_tc=2" ;; esac
}
decode() { # NAME ENGINE BATCH VARIANT: 128 in / 128 out, its decode step into the summary
    b1 "$1" 60 "$W/$2.kiln" --batch "$3" --input-len 128 --output-len 128 --reps 3 $(knob "$4")
    echo "$1: decode $(metric_at "$1" decode_ms_per_token "$3") ms a step, $(metric_at "$1" decode_tokens_per_s "$3") tok/s" >>"$S"
}
round() { # ROUND BATCHES-OF-BF16
    for v in tc cc; do
        n="fp8_b1024_${v}_r$1"
        b1 "$n" 100 "$W/fp8.kiln" --batch 1024 --input-len 128 --output-len 128 --reps 2 $(knob $v)
        echo "$n: e2e $(metric_at "$n" e2e_output_tokens_per_s 1024) out tok/s, decode $(metric_at "$n" decode_ms_per_token 1024) ms a step" >>"$S"
        for b in $2; do decode "bf16_b${b}_${v}_r$1" bf16 "$b" "$v"; done
    done
}
[ "${SKIP_ROUNDS:-0}" = 1 ] || round 1 "256 1 8"
for v in all cc; do
    for b in ${FP8_SMALL:-1 8 64}; do decode "fp8_b${b}_${v}" fp8 "$b" "$v"; done
done
[ "${SKIP_ROUNDS:-0}" = 1 ] || round 2 "256"
for v in ${PROFILES-tc cc}; do
    b1 "profile_fp8_$v" 100 "$W/fp8.kiln" --batch 1024 --input-len 128 --output-len 128 --reps 1 --profile $(knob $v)
    grep '"profile"' "$OUT/profile_fp8_$v.log" | grep '"decode"' | grep -o '"op":"[^"]*","count":[0-9]*,"ms_per_step":[0-9.e-]*' >>"$S"
done
echo "total: $((SECONDS - t0)) s" | tee -a "$S"

#!/usr/bin/env bash
# gpu_l8_e2e.sh — FP8 Llama-3.1-8B end to end (issue 12's ≥ 28,000 output tok/s at 128 in / 128 out) in one
# device call: a Llama-3.1-8B-shaped checkpoint (random weights, bench/make_checkpoint.py) compiled
# --quant fp8 --kv-dtype fp8 (KV scales calibrated on 64 random ids) with the default passes (kv8)
# and without norm-out-fp8 (kv8n: the RMSNorms write bf16, quantized again for the W8A8 GEMMs), both
# compiled before any bench runs (no compile beside a measurement); then `kiln bench` rounds alternating
# the two (a 2048-token prefill, 128 in / 128 out at $BATCHES), a --profile of kv8 at $PROFILE_BATCH, kv8
# at batch 1024 with a step budget of 16,384 tokens (the default 8,192), then the rounds again.
# While the checkpoint is written: test_gpu_kernels' test_w8a8, test_cublaslt_tune and test_rmsnorm
# (kiln_rmsnorm_fp8 against the norm and kiln_act_fp8), test_gpu_exec's W8A8, tuning and quantized tests.
# A kiln of another build in $BIN_B (VARIANTS naming kv8b) compiles kv8b as kv8 is compiled, for an A/B of
# two builds' codegen (its engine benched by $BIN's kiln, the runtime under test being the same).
#   BIN=.carry/bin OUT=$OUT bash bench/gpu_l8_e2e.sh          # SKIP_TESTS=1: the benches only
#   VARIANTS="kv8 kv8b" BIN_B=.carry/bin-b BIN=.carry/bin OUT=$OUT bash bench/gpu_l8_e2e.sh
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-l8e2e}
BUDGET=${BUDGET:-570}
BATCHES=${BATCHES:-1024}
PROFILE_BATCH=${PROFILE_BATCH:-1024}
PROFILE_OUT=${PROFILE_OUT:-32} # the profiled run's output tokens (128: the decode steps at the e2e runs' contexts)
VARIANTS=${VARIANTS:-kv8 kv8n} # the engines benched: kv8 always compiled; kv8n, kv16 (a bf16 KV cache), kv8b where named
K=$BIN/kiln
. bench/gpu_lib.sh
python3 bench/make_checkpoint.py --arch llama-3.1-8b --out "$W/l8" >"$OUT/checkpoint.log" 2>&1 &
ck=$!
# meanwhile the W8A8 GEMM checks (both kinds of plan, fast and promoted) and the GPU-CPU W8A8 test
[ "${SKIP_TESTS:-0}" = 1 ] || part kernels 120 env KILN_TEST_ONLY=test_w8a8,test_cublaslt_tune,test_rmsnorm "$BIN/test_gpu_kernels"
grep -E "FAIL" "$OUT/kernels.log" | head -10 >>"$S"
[ "${SKIP_TESTS:-0}" = 1 ] || part exec 120 env KILN_TEST_ONLY=${EXEC_TESTS:-test_w8a8_matches_cpu,test_tuning_record,test_quant_goldens} "$BIN/test_gpu_exec"
grep -E "FAIL" "$OUT/exec.log" | head -10 >>"$S"
wait $ck || { echo "checkpoint failed" >>"$S"; cat "$S"; exit 0; }
# the KV scales' calibration: 64 ids (the random checkpoint has no tokenizer for the built-in text)
python3 -c 'import random; random.seed(7); print([random.randrange(128000) for _ in range(64)])' >"$W/calib.json"
part compile_kv8 150 "$K" compile "$W/l8" -o "$W/kv8.kiln" --target sm_90 --quant fp8 --kv-dtype fp8 --calib-ids "$W/calib.json"
NO_NORM8=fuse-add-rmsnorm,fuse-qkv-rope,fuse-gate-up-swiglu,fuse-linear-residual,pack-weights,decode-attention-rope
NO_NORM8=$NO_NORM8,dce,fold-norm-into-ck-gemv,w8a8,w8a8-fast-accum,swiglu-out-fp8
[[ " $VARIANTS " = *" kv8n "* ]] && part compile_kv8n 150 "$K" compile "$W/l8" -o "$W/kv8n.kiln" --target sm_90 --quant fp8 --kv-dtype fp8 --calib-ids "$W/calib.json" \
    --passes "$NO_NORM8"
[[ " $VARIANTS " = *" kv8b "* ]] && part compile_kv8b 150 "${BIN_B:?kv8b needs BIN_B}/kiln" compile "$W/l8" \
    -o "$W/kv8b.kiln" --target sm_90 --quant fp8 --kv-dtype fp8 --calib-ids "$W/calib.json"
[[ " $VARIANTS " = *" kv16 "* ]] && part compile_kv16 150 "$K" compile "$W/l8" -o "$W/kv16.kiln" --target sm_90 --quant fp8
rm -rf "$W/l8"
prefill_round() { # ROUND
    for e in $VARIANTS; do
        n="${e}_p2048_r$1"
        b1 "$n" 60 "$W/$e.kiln" --batch 1 --input-len 2048 --output-len 2 --reps 3
        echo "$n: prefill 2048 $(metric_at "$n" prefill_ms 1) ms" >>"$S"
    done
}
e2e_round() { # ROUND
    for b in $BATCHES; do
        for e in $VARIANTS; do
            n="${e}_b${b}_r$1"
            b1 "$n" 100 "$W/$e.kiln" --batch "$b" --input-len 128 --output-len 128 --reps 2
            echo "$n: e2e $(metric_at "$n" e2e_output_tokens_per_s "$b") out tok/s, prefill $(metric_at "$n" prefill_ms "$b") ms," \
                "decode $(metric_at "$n" decode_ms_per_token "$b") ms a step" >>"$S"
        done
    done
}
prefill_round 1
e2e_round 1
b1 profile_kv8 120 "$W/kv8.kiln" --batch "$PROFILE_BATCH" --input-len 128 --output-len "$PROFILE_OUT" --reps 1 --profile
grep -A14 "^profile" "$OUT/profile_kv8.log" | cut -c1-130 >>"$S"
n=kv8_b1024_step16k
b1 "$n" 100 "$W/kv8.kiln" --batch 1024 --input-len 128 --output-len 128 --reps 2 --max-step-tokens 16384
echo "$n: e2e $(metric_at "$n" e2e_output_tokens_per_s 1024) out tok/s (--max-step-tokens 16384)" >>"$S"
prefill_round 2
e2e_round 2
echo "total: $((SECONDS - t0)) s" | tee -a "$S"

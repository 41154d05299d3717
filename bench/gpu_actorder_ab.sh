#!/usr/bin/env bash
# gpu_actorder_ab.sh — what act-order costs: two random Mistral-7B GPTQ g128 checkpoints
# (bench/make_checkpoint.py --gptq 128, one with --act-order), compiled by one kiln binary (the
# act-order one twice: default passes, and without fold-permute-into-rows and fold-permute-into-norm,
# so every permute a gather kernel: "nofold"), $ROUNDS rounds of kiln
# bench (decode at each of $BATCHES, 128 in / 128 out) alternating the engines within a round, then
# one --profile at batch 1 of each (the permute rows and the step).
#     BIN=.carry/bin OUT=$OUT bash bench/gpu_actorder_ab.sh
# $OUT gets summary.txt (one line a bench: round, engine, batch, tok/s; the profiles' permute rows),
# env.txt and the logs.
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-ao}
BUDGET=${BUDGET:-540}
ROUNDS=${ROUNDS:-2}
BATCHES=${BATCHES:-1 8}
K=$BIN/kiln
. bench/gpu_lib.sh
val() { grep "\"$1\"" | tail -1 | sed 's/.*"value":\([0-9.e+-]*\).*/\1/'; }
part ckpt_ordered 150 python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/ordered" --gptq 128
part ckpt_actorder 150 python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/actorder" --gptq 128 --act-order
NOFOLD=fuse-add-rmsnorm,fuse-qkv-rope,fuse-gate-up-swiglu,fuse-linear-residual,pack-weights,decode-attention-rope,dce,fold-norm-into-ck-gemv,w8a8,w8a8-fast-accum,swiglu-out-fp8,norm-out-fp8
part compile_ordered 120 "$K" compile "$W/ordered" -o "$W/ordered.kiln" --target sm_90
part compile_actorder 120 "$K" compile "$W/actorder" -o "$W/actorder.kiln" --target sm_90
part compile_nofold 120 "$K" compile "$W/actorder" -o "$W/nofold.kiln" --target sm_90 --passes "$NOFOLD"
rm -rf "${W:?}/ordered" "${W:?}/actorder" # the page cache is for the engines
ENGINES=${ENGINES:-ordered actorder nofold}
for round in $(seq "$ROUNDS"); do
    for e in $ENGINES; do
        for b in $BATCHES; do
            [ "$(left)" -gt 60 ] || break 3
            v=$(timeout 60 "$K" bench "$W/$e.kiln" --batch "$b" --input-len 128 --output-len 128 --reps 3 --json \
                2>>"$OUT/bench_err.log" | val decode_tokens_per_s)
            echo "round $round $e batch $b: ${v:-failed} tok/s" | tee -a "$S"
        done
    done
done
for e in $ENGINES; do
    [ "$(left)" -gt 40 ] || break
    timeout 40 "$K" bench "$W/$e.kiln" --batch 1 --input-len 128 --output-len 64 --reps 2 --profile \
        >"$OUT/profile_$e.log" 2>&1
    { echo "profile $e (batch 1):"; grep -iE "permute|total|step|gemm|linear" "$OUT/profile_$e.log" | head -24; } >>"$S"
done
echo "done at $((SECONDS - t0)) s" | tee -a "$S"

#!/usr/bin/env bash
# gpu_qwen_run.sh — issue 14's Qwen GPU checks in one device call, in the order that matters:
#   kernels   test_gpu_kernels test_rope_kv: rope_kv with Qwen2's biases and Qwen3's q/k norms
#             against a plain double reference
#   exec      test_gpu_exec test_tiny_goldens: tiny-qwen2 (biases, one windowed layer) in f32 on the
#             GPU against its HF golden (ids identical, logits within 1e-3)
#   tiny      tiny-qwen3 (head_dim 32) and tiny-qwen2 random checkpoints (bench/make_checkpoint.py):
#             kiln bf16 on the GPU vs HF fp32 and HF bf16 (bench/check_logits.py, bound 1.25x)
#   8b        Qwen3-8B shapes, random weights: kiln bench decode at batch 1 and 8 (GPU alone), then
#             the logits bound at lengths $LENGTHS if time is left
# Every part has a timeout; the whole run stays under $BUDGET seconds (default 190).
# Run from the repository root with the binaries in $BIN (kiln, test_gpu_kernels, test_gpu_exec,
# kiln_gpu_logits):  BIN=.carry/bin OUT=out bash bench/gpu_qwen_run.sh
# $OUT gets summary.txt, env.txt and one log per part (+ tiny.jsonl, 8b.jsonl, bench8b.jsonl).
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
BUDGET=${BUDGET:-190}
LENGTHS=${LENGTHS:-1,17,512}
W=${WORK:-/tmp/kiln-qwen}
. bench/gpu_lib.sh

# the 8B checkpoint is drawn on the GPU first (seconds), written while the tests run
( timeout 80 python3 bench/make_checkpoint.py --arch qwen3-8b --out "$W/q8b" &&
  timeout 60 "$BIN/kiln" compile "$W/q8b" -o "$W/q8b.kiln" --target sm_90 ) >"$OUT/8b_build.log" 2>&1 &
build8b=$!

part kernels 60 env KILN_TEST_ONLY=test_rope_kv "$BIN/test_gpu_kernels"
part exec 80 env KILN_TEST_ONLY=test_tiny_goldens "$BIN/test_gpu_exec"

# tiny random Qwen checkpoints against HF: kiln bf16 (GPU) vs HF fp32 and HF bf16
tiny() {
    local arch=$1 d=$W/$1
    python3 bench/make_checkpoint.py --arch "$arch" --out "$d" --device cpu &&
        "$BIN/kiln" compile "$d" -o "$d.kiln" --target sm_90 &&
        mkdir -p "$d/lg" &&
        python3 bench/check_logits.py ids --out "$d/lg/ids.i32" --n 304 --vocab 256 &&
        "$BIN/kiln_gpu_logits" "$d.kiln" logits --ids "$d/lg/ids.i32" --lengths 1,17,100,300 --decode 4 \
            --chunk 64 --out "$d/lg" &&
        python3 bench/check_logits.py hf --model "$d" --ids "$d/lg/ids.i32" --lengths 1,17,100,300 --decode 4 \
            --out "$d/lg" &&
        python3 bench/check_logits.py compare --dir "$d/lg" --lengths 1,17,100,300 --vocab 256 |
        sed "s/^{/{\"model\": \"$arch\", /" | tee -a "$OUT/tiny.jsonl"
}
part tiny 70 bash -c "$(declare -f tiny); W=$W BIN=$BIN OUT=$OUT; tiny tiny-qwen3 && tiny tiny-qwen2"

wait $build8b
echo "8b_build: rc $?, at $((SECONDS - t0)) s: $(grep -h 'wrote\|error' "$OUT/8b_build.log" | tail -1)" | tee -a "$S"
if [ -f "$W/q8b.kiln" ] && [ "$(left)" -gt 40 ]; then
    part bench8b 40 "$BIN/kiln" bench "$W/q8b.kiln" --batch 1 --input-len 128 --output-len 128 --reps 3 --json
    cp "$OUT/bench8b.log" "$OUT/bench8b.jsonl"
    [ "$(left)" -gt 30 ] && part bench8b_b8 30 "$BIN/kiln" bench "$W/q8b.kiln" --batch 8 --input-len 128 \
        --output-len 128 --reps 2 --json
fi
if [ -f "$W/q8b.kiln" ] && [ "$(left)" -gt 45 ]; then
    n=$((${LENGTHS##*,} + 2))
    logits8b() {
        mkdir -p "$W/lg" &&
            python3 bench/check_logits.py ids --out "$W/lg/ids.i32" --n "$n" --vocab 151936 &&
            "$BIN/kiln_gpu_logits" "$W/q8b.kiln" logits --ids "$W/lg/ids.i32" --lengths "$LENGTHS" --decode 2 \
                --chunk 2048 --out "$W/lg" &&
            python3 bench/check_logits.py hf --model "$W/q8b" --ids "$W/lg/ids.i32" --lengths "$LENGTHS" \
                --decode 2 --out "$W/lg" &&
            python3 bench/check_logits.py compare --dir "$W/lg" --lengths "$LENGTHS" --vocab 151936 |
            tee "$OUT/8b.jsonl"
    }
    part logits8b $(($(left) - 5)) bash -c "$(declare -f logits8b); W=$W BIN=$BIN OUT=$OUT n=$n LENGTHS=$LENGTHS; logits8b"
fi
echo "done at $((SECONDS - t0)) s" | tee -a "$S"

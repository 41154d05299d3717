#!/usr/bin/env bash
# gpu_mixtral_run.sh — issue 14's Mixtral-8x7B measurements on one H200, in one device call.
# The device's 64 GB disk holds neither the 93 GB checkpoint nor its engine, so the model gets
# LAYERS of its 32 layers (bench/make_checkpoint.py --layers); docs/benchmarks.md scales a layer's
# cost from two such engines (2 and 8 layers) to 32.
#
#   bench   kiln bench at batch 1, 8, 16, 64 (128 in / 128 out) and prefill 2048; with OLD_KILN
#           (another kiln binary) batch 16 and 64 again, alternating old and new, for an A/B
#   logits  kiln bf16 vs HF fp32 and bf16 (bench/check_logits.py) at lengths 1,17,512,4096
#   peer    HF transformers eager as the decode peer (bench/hf_peer_decode.py) at batch 1 and 64
#
# Run from the repository root with the binaries (kiln, kiln_gpu_logits) in $BIN, $OUT set:
#     BIN=.carry/bin LAYERS=2 MODES=bench,logits,peer OUT=$OUT bash bench/gpu_mixtral_run.sh
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-mixtral}
LAYERS=${LAYERS:-2}
MODES=${MODES:-bench}
BUDGET=${BUDGET:-480}
. bench/gpu_lib.sh
val() { grep "\"$1\"" | tail -1 | sed 's/.*"value":\([0-9.e+-]*\).*/\1/'; }
[ -e "$W/mx/config.json" ] ||
    timeout 200 python3 bench/make_checkpoint.py --arch mixtral-8x7b --layers "$LAYERS" --out "$W/mx" >"$OUT/mk.log" 2>&1
[ -e "$W/mx.kiln" ] || timeout 150 "$BIN/kiln" compile "$W/mx" -o "$W/mx.kiln" --target sm_90 >"$OUT/compile.log" 2>&1
echo "layers $LAYERS, engine ready at $((SECONDS - t0)) s" | tee -a "$S"
case ",$MODES," in *,bench,*)
    for bb in 1 8 16 64; do
        echo "kiln batch $bb: $(timeout 60 "$BIN/kiln" bench "$W/mx.kiln" --batch $bb --reps 3 --json | val decode_tokens_per_s) tok/s"
    done | tee -a "$S"
    echo "kiln prefill 2048: $(timeout 60 "$BIN/kiln" bench "$W/mx.kiln" --batch 1 --input-len 2048 --output-len 1 --reps 3 --json | val prefill_ms) ms" | tee -a "$S"
    if [ -n "${OLD_KILN:-}" ]; then
        for round in 1 2; do for v in old new; do
            K=$BIN/kiln
            [ $v = old ] && K=$OLD_KILN
            for bb in 16 64; do
                echo "A/B round $round $v batch $bb: $(timeout 60 "$K" bench "$W/mx.kiln" --batch $bb --reps 3 --json | val decode_tokens_per_s) tok/s"
            done
        done; done | tee -a "$S"
    fi ;;
esac
case ",$MODES," in *,logits,*)
    L=1,17,512,4096
    mkdir -p "$W/lg"
    python3 bench/check_logits.py ids --out "$W/lg/ids.i32" --n 4098 --vocab 32000 >"$OUT/logits.log" 2>&1
    timeout 60 "$BIN/kiln_gpu_logits" "$W/mx.kiln" logits --ids "$W/lg/ids.i32" --lengths $L --decode 2 --chunk 2048 \
        --out "$W/lg" >>"$OUT/logits.log" 2>&1 &
    k=$!
    timeout 170 python3 bench/check_logits.py hf --model "$W/mx" --ids "$W/lg/ids.i32" --lengths $L --decode 2 \
        --out "$W/lg" >>"$OUT/logits.log" 2>&1
    wait $k
    python3 bench/check_logits.py compare --dir "$W/lg" --lengths $L --vocab 32000 | tee "$OUT/logits.jsonl" ;;
esac
case ",$MODES," in *,peer,*)
    timeout 150 python3 bench/hf_peer_decode.py --ckpt "$W/mx" --attn eager --batch 1,64 --prompt 128 --new 32 2>&1 |
        grep '^{' | tee "$OUT/peer.jsonl" ;;
esac
echo "done at $((SECONDS - t0)) s" | tee -a "$S"

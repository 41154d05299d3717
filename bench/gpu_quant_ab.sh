#!/usr/bin/env bash
# gpu_quant_ab.sh — an A/B of engines of one Mistral-7B checkpoint (random weights, drawn on the GPU
# by bench/make_checkpoint.py) in one device call: each variant compiled with its own kiln binary
# and flags, then $ROUNDS rounds of kiln bench (decode at each of $BATCHES, 128 in / 128 out),
# variants alternating within a round, so that a difference shows against the same machine's noise
# (figures from different device calls are not comparable).
#   VARIANTS: one variant a line, "name|kiln binary|compile flags[|bench flags]" (the binary also runs
#   its bench); "name|=other||bench flags" benches variant other's engine with its binary (no compile)
#     VARIANTS=$'old|.carry/old/kiln|--quant int8\nnew|.carry/bin/kiln|--quant int8\nw1|=new||--measure attn_waves=1' \
#       BIN=.carry/bin OUT=$OUT bash bench/gpu_quant_ab.sh
# $OUT gets summary.txt (one line a bench: round, variant, batch, tok/s), env.txt and the logs.
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-ab}
BUDGET=${BUDGET:-540}
ROUNDS=${ROUNDS:-2}
BATCHES=${BATCHES:-1}
VARIANTS=${VARIANTS:?"VARIANTS: lines of name|kiln binary|compile flags"}
. bench/gpu_lib.sh
val() { grep "\"$1\"" | tail -1 | sed 's/.*"value":\([0-9.e+-]*\).*/\1/'; }
part checkpoint 150 python3 bench/make_checkpoint.py --arch mistral-7b --out "$W/m7"
names=()
while IFS='|' read -r name kiln flags bflags; do
    [ -n "$name" ] || continue
    if [ "${kiln#=}" != "$kiln" ]; then # another variant's engine and binary
        line=$(grep "^${kiln#=}|" "$W/built" | tail -1) || { echo "$name: no variant ${kiln#=}" >>"$S"; continue; }
        echo "$name|$(echo "$line" | cut -d'|' -f2)|$(echo "$line" | cut -d'|' -f3)|$bflags" >>"$W/built"
        names+=("$name")
        continue
    fi
    # shellcheck disable=SC2086 # the flags are words
    part "compile_$name" 90 "$kiln" compile "$W/m7" -o "$W/$name.kiln" --target sm_90 $flags && names+=("$name")
    echo "$name|$kiln|$W/$name.kiln|$bflags" >>"$W/built"
done <<<"$VARIANTS"
for round in $(seq "$ROUNDS"); do
    for name in "${names[@]}"; do
        line=$(grep "^$name|" "$W/built" | tail -1)
        kiln=$(echo "$line" | cut -d'|' -f2) engine=$(echo "$line" | cut -d'|' -f3) bflags=$(echo "$line" | cut -d'|' -f4)
        for b in $BATCHES; do
            [ "$(left)" -gt 30 ] || break 3
            # shellcheck disable=SC2086 # the flags are words
            v=$(timeout 60 "$kiln" bench "$engine" --batch "$b" --input-len 128 --output-len 128 --reps 3 $bflags \
                --json 2>>"$OUT/bench_err.log" | val decode_tokens_per_s)
            echo "round $round $name batch $b: ${v:-failed} tok/s" | tee -a "$S"
        done
    done
done
echo "done at $((SECONDS - t0)) s" | tee -a "$S"

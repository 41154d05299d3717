#!/usr/bin/env bash
# cli_quant_auto.sh — `kiln compile --quant auto` on tests/data/tiny-mistral (calibration as token
# ids: the checkpoint has no tokenizer) at a budget that forces the smallest formats, one between
# and one that keeps everything: the weights fit each budget (kiln inspect --json), the formats grow
# and the measured calibration KL does not as the budget grows, the engines run (kiln run,
# kiln perplexity), the same options give the same bytes, --target-bits holds, --max-ppl-increase
# P measures at most P% on the calibration, Qwen2 and Qwen3-MoE compile and run. On
# models/kjv-tiny (which has a tokenizer) the built-in calibration text and --calib FILE. The
# refusals: no budget, two budgets, a budget without auto, a budget under the smallest mix (naming
# its size), --calib without auto, empty / short / unreadable calibration, ids outside the
# vocabulary, text calibration without a tokenizer, malformed values.
#
# usage: bash tests/cli_quant_auto.sh KILN_EXE SOURCE_DIR [SHARED_DIR]
set -u
KILN=$1
SRC=$2
SHARED=${3:-$SRC/../shared}
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-cli-qauto-XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/lib_cli.sh"
CK=$SRC/tests/data/tiny-mistral
python3 -c "
import random; random.seed(7); print(' '.join(str(random.randrange(256)) for _ in range(400)))" >"$T/ids.txt"
AUTO=(--target none --quant auto --calib-ids "$T/ids.txt")

# the sizes: every projection at its smallest format, and every projection kept
"$KILN" compile "$CK" -o "$T/probe.kiln" "${AUTO[@]}" --max-weight-bytes 1G --json >"$T/probe.json" 2>"$T/err" \
    || bad "compile at 1G: $(cat "$T/err")"
read -r SMALL LARGE < <(python3 -c "import json,sys; a=json.load(open(sys.argv[1]))['quant']['auto']
print(a['smallest_bytes'], a['largest_bytes'])" "$T/probe.json")
MID=$(( (SMALL + LARGE) / 2 ))
prev=""
for B in "$SMALL" "$MID" "$LARGE"; do
    E=$T/b$B.kiln
    if ! "$KILN" compile "$CK" -o "$E" "${AUTO[@]}" --max-weight-bytes "$B" --json >"$T/c$B.json" 2>"$T/err"; then
        bad "compile --max-weight-bytes $B: $(cat "$T/err")"
        continue
    fi
    "$KILN" inspect "$E" --json >"$T/i$B.json" || bad "inspect $B"
    python3 - "$B" "$T/c$B.json" "$T/i$B.json" "$SMALL" "$LARGE" "$prev" <<'PY' && ok || bad "budget $B"
import json, sys
budget, small, large = int(sys.argv[1]), int(sys.argv[4]), int(sys.argv[5])
a = json.load(open(sys.argv[2]))["quant"]["auto"]
ins = json.load(open(sys.argv[3]))
wb = ins["weights"]["bytes"]
assert wb <= budget, (wb, budget)
assert wb == a["weight_bytes"], (wb, a["weight_bytes"])
assert ins["build"]["quant"]["weights"] == "auto"
assert len(ins["quant_layers"]) == 2 and ins["quant_layers"][0].startswith("layer 0: qkv_proj "), ins["quant_layers"]
mats = a["matrices"]
assert len(mats) == 8
if budget == small:
    assert wb == small and all(m["format"].startswith("q4") for m in mats), mats
if budget == large:
    assert all(m["format"] == "bf16" for m in mats), mats
    assert abs(a["measured_kl"] - a["base_kl"]) < 1e-6, a  # only the LM head's q8 is left
# the prediction is the base (the LM head's q8, measured alone) plus what each chosen format adds
assert a["base_kl"] > 0
assert abs(a["predicted_kl"] - a["base_kl"] - sum(m["kl"] for m in mats)) < 1e-9
if sys.argv[6]:
    p = json.load(open(sys.argv[6]))["quant"]["auto"]
    assert a["measured_kl"] <= p["measured_kl"] + 1e-12, (a["measured_kl"], p["measured_kl"])
    assert a["predicted_kl"] <= p["predicted_kl"] + 1e-12
    assert sum(m["bytes"] for m in mats) >= sum(m["bytes"] for m in p["matrices"])
PY
    prev=$T/c$B.json
    "$KILN" run "$E" --prompt-ids 1,5,9 --max-tokens 4 --device cpu >/dev/null 2>"$T/err" && ok || bad "run $B: $(cat "$T/err")"
    "$KILN" perplexity "$E" --ids-file "$T/ids.txt" --window 64 --device cpu >/dev/null 2>"$T/err" && ok \
        || bad "perplexity $B: $(cat "$T/err")"
done
# deterministic: the same options, the same bytes
"$KILN" compile "$CK" -o "$T/again.kiln" "${AUTO[@]}" --max-weight-bytes "$MID" >/dev/null 2>&1 \
    && cmp -s "$T/again.kiln" "$T/b$MID.kiln" && ok || bad "two compiles at $MID differ"
# --target-bits: the average over all weights at most B (inspect's count)
"$KILN" compile "$CK" -o "$T/tb.kiln" "${AUTO[@]}" --target-bits 9 >/dev/null 2>"$T/err" || bad "--target-bits 9: $(cat "$T/err")"
"$KILN" inspect "$T/tb.kiln" --json | python3 -c "import json,sys; j=json.load(sys.stdin)
assert j['plan']['bits_per_weight'] <= 9, j['plan']; assert j['build']['quant']['auto']['budget']['target_bits'] == 9" \
    && ok || bad "--target-bits 9 exceeded"

# --max-ppl-increase P: the mix measures at most P% over the reference on the calibration; a huge P
# gives the smallest mix
for P in 1 1000; do
    "$KILN" compile "$CK" -o "$T/p$P.kiln" "${AUTO[@]}" --max-ppl-increase $P --json >"$T/p$P.json" 2>"$T/err" \
        || bad "--max-ppl-increase $P: $(cat "$T/err")"
    python3 - "$P" "$T/p$P.json" "$SMALL" <<'PY' && ok || bad "--max-ppl-increase $P: $(cat "$T/p$P.json")"
import json, math, sys
P, small = float(sys.argv[1]), int(sys.argv[3])
a = json.load(open(sys.argv[2]))["quant"]["auto"]
assert a["budget"]["max_ppl_increase"] == P
assert math.expm1(a["measured_nll_change"]) * 100 <= P, a["measured_nll_change"]
assert a["weight_bytes"] <= a["budget"]["max_weight_bytes"]
if P == 1000:
    assert a["weight_bytes"] == small, (a["weight_bytes"], small)
PY
done

# other architectures: Qwen2's q/k/v biases, a mixture of experts (its 3-D expert stacks are not
# candidates: the attention's matrices are), each compiled at a middle budget and run
for m in tiny-qwen2 tiny-qwen3-moe; do
    "$KILN" compile "$SRC/tests/data/$m" -o "$T/$m.kiln" "${AUTO[@]}" --target-bits 13 --json >"$T/$m.json" 2>"$T/err" \
        || bad "$m: $(cat "$T/err")"
    python3 -c "import json,sys; a=json.load(open(sys.argv[1]))['quant']['auto']
assert a['bits_per_weight'] <= 13 and a['matrices'] and all('experts' not in m['name'] for m in a['matrices']), a" \
        "$T/$m.json" && ok || bad "$m: $(cat "$T/$m.json")"
    "$KILN" run "$T/$m.kiln" --prompt-ids 1,5,9 --max-tokens 4 --device cpu >/dev/null 2>"$T/err" && ok || bad "run $m: $(cat "$T/err")"
done

# the built-in calibration text and --calib FILE (models/kjv-tiny has a tokenizer; few tokens, to be quick:
# each candidate is a forward pass, 50 s for 32 tokens in CI's ASan + UBSan debug build)
S=$SRC/models/kjv-tiny
"$KILN" compile "$S" -o "$T/s.kiln" --target none --quant auto --target-bits 8 --calib-tokens 32 --json \
    >"$T/s.json" 2>"$T/err" || bad "kjv-tiny built-in calibration: $(cat "$T/err")"
python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['quant']['auto']['calibration']
assert c['source'] == 'built-in text' and c['tokens'] == 32 and c['bytes'] > 5000, c" "$T/s.json" \
    && ok || bad "built-in calibration: $(cat "$T/s.json")"
head -c 3000 "$SRC/docs/quantization.md" >"$T/calib.txt"
"$KILN" compile "$S" -o "$T/s2.kiln" --target none --quant auto --target-bits 8 --calib "$T/calib.txt" \
    --calib-tokens 40 --json >"$T/s2.json" 2>"$T/err" || bad "kjv-tiny --calib: $(cat "$T/err")"
python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['quant']['auto']['calibration']
assert c['source'] == 'text file' and c['tokens'] == 40 and c['bytes'] == 3000, c" "$T/s2.json" && ok || bad "--calib file"
"$KILN" run "$T/s2.kiln" --prompt "In the beginning" --max-tokens 8 --device cpu >/dev/null 2>"$T/err" && ok \
    || bad "run kjv-tiny auto: $(cat "$T/err")"

echo "1 2 3 4 5" >"$T/short.txt"
# --awq (compiler/quant_awq.c) on kjv-tiny: its scales' report, the engine runs; test_quant_awq checks the numbers
"$KILN" compile "$S" -o "$T/a.kiln" --target none --quant int4 --awq --calib-tokens 64 --json >"$T/a.json" 2>"$T/err" \
    || bad "awq compile: $(cat "$T/err")"
python3 -c "import json, sys; a = json.load(open(sys.argv[1]))['quant']['awq']
assert a['tokens'] == 64 and a['groups_searched'] == 20 and 0 < a['groups_scaled'] <= 20, a
assert a['error'] <= a['error_unscaled'], a" "$T/a.json" && ok || bad "--awq report"
"$KILN" run "$T/a.kiln" --prompt "In the beginning" --max-tokens 8 --device cpu >/dev/null 2>"$T/err" && ok \
    || bad "run kjv-tiny awq: $(cat "$T/err")"
expect 2 "--awq needs --quant int8, fp8, int4 or auto" -- "$KILN" compile "$S" -o "$T/x.kiln" --awq
# --awq with auto: the scales searched first, auto measures the scaled model; the engine records both
"$KILN" compile "$CK" -o "$T/aa.kiln" "${AUTO[@]}" --target-bits 9 --awq --json >"$T/aa.json" 2>"$T/err" \
    || bad "awq + auto: $(cat "$T/err")"
python3 -c "import json, sys; q = json.load(open(sys.argv[1]))['quant']
assert q['awq']['groups_scaled'] > 0 and q['auto']['weight_bytes'] > 0, q
assert 'activation-aware' in q['method'], q['method']" "$T/aa.json" && ok || bad "--awq with auto: the record"
"$KILN" run "$T/aa.kiln" --prompt-ids 1,5,9 --max-tokens 4 --device cpu >/dev/null 2>"$T/err" && ok \
    || bad "run awq + auto: $(cat "$T/err")"
expect 1 "--awq: .*has 5 tokens; at least 32" -- "$KILN" compile "$CK" -o "$T/x.kiln" --target none --quant int4 --awq --calib-ids "$T/short.txt"

# refusals
expect 2 "needs a budget" -- "$KILN" compile "$CK" -o "$T/x.kiln" --quant auto --calib-ids "$T/ids.txt"
expect 2 "one budget" -- "$KILN" compile "$CK" -o "$T/x.kiln" --quant auto --max-weight-bytes 1M --target-bits 6
expect 2 "max-weight-bytes applies with --quant auto" -- "$KILN" compile "$CK" -o "$T/x.kiln" --quant int8 --max-weight-bytes 1M
expect 2 "target-bits applies with --quant auto" -- "$KILN" compile "$CK" -o "$T/x.kiln" --target-bits 4
expect 2 "calib applies with --quant auto" -- "$KILN" compile "$CK" -o "$T/x.kiln" --quant int8 --calib "$T/ids.txt"
expect 2 "calib-tokens applies" -- "$KILN" compile "$CK" -o "$T/x.kiln" --calib-tokens 64
expect 2 "expected a percentage" -- "$KILN" compile "$CK" -o "$T/x.kiln" --quant auto --max-ppl-increase 0
expect 2 "not two" -- "$KILN" compile "$CK" -o "$T/x.kiln" --quant auto --max-ppl-increase 1 --target-bits 6
expect 2 "max-ppl-increase applies with --quant auto" -- "$KILN" compile "$CK" -o "$T/x.kiln" --max-ppl-increase 1
expect 2 "expected a whole number of bytes" -- "$KILN" compile "$CK" -o "$T/x.kiln" --quant auto --max-weight-bytes 18X
expect 2 "expected a whole number of bytes" -- "$KILN" compile "$CK" -o "$T/x.kiln" --quant auto --max-weight-bytes 0
expect 2 "expected a number of bits" -- "$KILN" compile "$CK" -o "$T/x.kiln" --quant auto --target-bits -1
expect 2 "give one calibration" -- "$KILN" compile "$CK" -o "$T/x.kiln" --quant auto --target-bits 6 --calib a --calib-ids b
expect 2 "auto tries groups of 32, 64 and 128 itself" -- "$KILN" compile "$CK" -o "$T/x.kiln" --quant auto --target-bits 6 --group-size 32
expect 1 "smallest mix .* takes $SMALL weight bytes" -- "$KILN" compile "$CK" -o "$T/x.kiln" "${AUTO[@]}" --max-weight-bytes $((SMALL - 1))
no_file "$T/x.kiln"
: >"$T/empty.txt"
expect 1 "has 0 tokens; at least 32" -- "$KILN" compile "$CK" -o "$T/x.kiln" --target none --quant auto --target-bits 6 --calib-ids "$T/empty.txt"
echo "1 2 3 4 5" >"$T/short.txt"
expect 1 "has 5 tokens; at least 32" -- "$KILN" compile "$CK" -o "$T/x.kiln" --target none --quant auto --target-bits 6 --calib-ids "$T/short.txt"
echo "1 2 300 4" >"$T/big.txt"
expect 1 "id 300 .* outside the model's vocabulary" -- "$KILN" compile "$CK" -o "$T/x.kiln" --target none --quant auto --target-bits 6 --calib-ids "$T/big.txt"
expect 1 "calib-ids: .*nope" -- "$KILN" compile "$CK" -o "$T/x.kiln" --target none --quant auto --target-bits 6 --calib-ids "$T/nope"
expect 1 "no tokenizer.json" -- "$KILN" compile "$CK" -o "$T/x.kiln" --target none --quant auto --target-bits 6 --calib "$T/ids.txt"
expect 1 "no tokenizer.json" -- "$KILN" compile "$CK" -o "$T/x.kiln" --target none --quant auto --target-bits 6
expect 2 "already quantized" -- "$KILN" compile "$SRC/tests/data/tiny-mistral-awq" -o "$T/x.kiln" --quant auto --target-bits 6
no_file "$T/x.kiln"
ls "$T"/x.kiln.calib.* >/dev/null 2>&1 && bad "a calibration engine was left behind" || ok
cli_summary

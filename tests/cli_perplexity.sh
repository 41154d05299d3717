#!/usr/bin/env bash
# cli_perplexity.sh — `kiln perplexity` on the CPU against HuggingFace: models/kjv-tiny on
# tests/data/ppl/genesis-1.txt, for each window setting of tests/golden/ppl/kjv-tiny.json (made by
# tests/golden/make_ppl_golden.py with transformers in float32): the same token, window and scored
# counts, and the mean NLL within 1e-5 relative. Ids given as a JSON array, as plain whitespace-
# separated ids and through stdin score the same. `kiln run --logprobs` against HF's log-softmax of
# the stories260k golden, and `kiln run --prompt-logprobs` against the same. Bad input exits 1 or 2
# naming what is wrong.
#
# usage: bash tests/cli_perplexity.sh KILN_EXE SOURCE_DIR [SHARED_DIR]
set -u
KILN=$1
SRC=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-cli-ppl-XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/lib_cli.sh"
TEXT=$SRC/tests/data/ppl/genesis-1.txt
GOLD=$SRC/tests/golden/ppl/kjv-tiny.json

"$KILN" compile "$SRC/models/kjv-tiny" -o "$T/kjv.kiln" --target none >/dev/null 2>&1 || bad "compile kjv-tiny"
E=$T/kjv.kiln

# each golden case: kiln's JSON against HF's numbers
n_cases=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['cases']))" "$GOLD")
for i in $(seq 0 $((n_cases - 1))); do
    args=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['cases'][int(sys.argv[2])]
print('--window %d --stride %d%s' % (c['window'], c['stride'], ' --bos' if c['bos'] else ''))" "$GOLD" "$i")
    # shellcheck disable=SC2086
    if "$KILN" perplexity "$E" --text-file "$TEXT" $args --device cpu --threads 2 --json >"$T/p$i" 2>"$T/err"; then
        python3 - "$GOLD" "$i" "$T/p$i" <<'PY' && ok || bad "perplexity $args differs from HF: $(cat "$T/p$i")"
import json, sys
want = json.load(open(sys.argv[1]))["cases"][int(sys.argv[2])]
got = json.load(open(sys.argv[3]))
for k in ("tokens", "windows", "scored", "window", "stride", "bos"):
    assert got[k] == want[k], (k, got[k], want[k])
assert abs(got["nll_mean"] - want["nll_mean"]) <= 1e-5 * want["nll_mean"], (got["nll_mean"], want["nll_mean"])
assert abs(got["perplexity"] / want["perplexity"] - 1) <= 2e-5, (got["perplexity"], want["perplexity"])
PY
    else
        bad "perplexity $args exited $?: $(cat "$T/err")"
    fi
done

# the same ids as a JSON array, as plain ids, and on stdin: the same numbers as the text
"$KILN" tokenize "$SRC/models/kjv-tiny" --no-bos <"$TEXT" >"$T/ids.json" 2>"$T/err" || bad "tokenize: $(cat "$T/err")"
tr -d '[]' <"$T/ids.json" | tr ',' '\n' >"$T/ids.txt"
for src in "--ids-file $T/ids.json" "--ids-file $T/ids.txt"; do
    # shellcheck disable=SC2086
    "$KILN" perplexity "$E" $src --window 64 --device cpu --json >"$T/q" 2>"$T/err" || bad "$src: $(cat "$T/err")"
    python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); assert a['nll_mean']==b['nll_mean'] and a['scored']==b['scored']" \
        "$T/p0" "$T/q" && ok || bad "$src scores otherwise than the text"
done
"$KILN" perplexity "$E" --ids-file - --window 64 --device cpu --json <"$T/ids.txt" >"$T/q" 2>"$T/err" &&
    python3 -c "import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); assert a['nll_mean']==b['nll_mean']" \
        "$T/p0" "$T/q" && ok || bad "--ids-file - (stdin): $(cat "$T/err")"
# --measure: the GPU's knobs, refused on the CPU naming the device, and an unknown one refused by name
"$KILN" perplexity "$E" --text-file "$TEXT" --window 64 --device cpu --measure w8a8=0 >"$T/q" 2>"$T/err" &&
    bad "--measure w8a8=0 accepted on the CPU" ||
    { grep -q "apply to the GPU executor, not device \"cpu\"" "$T/err" && ok || bad "--measure on the CPU: $(cat "$T/err")"; }
"$KILN" perplexity "$E" --text-file "$TEXT" --window 64 --device cpu --measure w8a8=3 >"$T/q" 2>"$T/err" &&
    bad "--measure w8a8=3 accepted" || { grep -q "'w8a8=3' is not a known knob" "$T/err" && ok || bad "--measure w8a8=3: $(cat "$T/err")"; }
# the text form prints the numbers a person reads
"$KILN" perplexity "$E" --text-file "$TEXT" --window 64 --device cpu >"$T/out" 2>&1 &&
    grep -Eq "^perplexity [0-9.]+ over 356 of 362 tokens \(6 windows of 64 every 64; mean NLL [0-9.]+, [0-9.]+ bits per token; cpu" "$T/out" &&
    ok || bad "text output: $(cat "$T/out")"

# kiln run --logprobs: each greedy token's log-probability and alternatives against HF's log-softmax
# of the stories260k golden logits (case 1: its prompt, then its greedy ids)
G=$SRC/tests/golden/stories260k
"$KILN" compile "$SRC/models/stories260k" -o "$T/s.kiln" --target none >/dev/null 2>&1 || bad "compile stories260k"
ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['cases'][1]['prompt'])))" "$G/golden.json")
if "$KILN" run "$T/s.kiln" --prompt-ids "$ids" --max-tokens 12 --temperature 0 --logprobs 3 --json --device cpu \
    >"$T/run.json" 2>"$T/err"; then
    python3 - "$G" "$T/run.json" <<'PY' && ok || bad "kiln run --logprobs differs from HF"
import json, math, sys
from array import array
g = json.load(open(sys.argv[1] + "/golden.json"))["cases"][1]
run = json.load(open(sys.argv[2]))
V, P = g["vocab"], len(g["prompt"])
flat = array("f")
with open(sys.argv[1] + "/" + g["logits"], "rb") as f:
    flat.frombytes(f.read())
if sys.byteorder != "little":
    flat.byteswap()
assert run["ids"] == g["greedy"][:12], (run["ids"], g["greedy"][:12])
assert len(run["logprobs"]) == 12
for i, t in enumerate(run["logprobs"]):
    row = [float(v) for v in flat[(P - 1 + i) * V:(P + i) * V]]
    m = max(row)
    lse = m + math.log(sum(math.exp(v - m) for v in row))
    assert t["id"] == run["ids"][i] and abs(t["logprob"] - (row[t["id"]] - lse)) < 1e-4, (i, t)
    assert len(t["top"]) == 3 and t["top"][0]["id"] == t["id"] and t["top"][0]["logprob"] == t["logprob"]
    for a in t["top"]:
        assert abs(a["logprob"] - (row[a["id"]] - lse)) < 1e-4, (i, a)
    # rank order: logit descending, id ascending (a stable sort of the negated logits)
    assert [a["id"] for a in t["top"]] == sorted(range(V), key=lambda k: -row[k])[:3]
PY
else
    bad "kiln run --logprobs exited $?: $(cat "$T/err")"
fi
# kiln run --prompt-logprobs: the same case's prompt and greedy ids as one prompt, scored alone
# (--max-tokens 0): each position's log-probability and alternatives against HF's log-softmax
seq=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['cases'][1]; print(','.join(map(str, c['prompt'] + c['greedy'][:12])))" "$G/golden.json")
if "$KILN" run "$T/s.kiln" --prompt-ids "$seq" --max-tokens 0 --prompt-logprobs 3 --json --device cpu \
    >"$T/prun.json" 2>"$T/err"; then
    python3 - "$G" "$T/prun.json" <<'PY' && ok || bad "kiln run --prompt-logprobs differs from HF"
import json, math, sys
from array import array
g = json.load(open(sys.argv[1] + "/golden.json"))["cases"][1]
run = json.load(open(sys.argv[2]))
V = g["vocab"]
seq = g["prompt"] + g["greedy"][:12]
flat = array("f")
with open(sys.argv[1] + "/" + g["logits"], "rb") as f:
    flat.frombytes(f.read())
if sys.byteorder != "little":
    flat.byteswap()
assert run["ids"] == [] and run["stop_reason"] == "max_tokens", (run["ids"], run["stop_reason"])
lp = run["prompt_logprobs"]
assert len(lp) == len(seq) and lp[0] is None, len(lp)
for p in range(1, len(seq)):
    row = [float(v) for v in flat[(p - 1) * V:p * V]]
    m = max(row)
    lse = m + math.log(sum(math.exp(v - m) for v in row))
    t = lp[p]
    assert t["id"] == seq[p] and abs(t["logprob"] - (row[seq[p]] - lse)) < 1e-4, (p, t)
    assert [a["id"] for a in t["top"]] == sorted(range(V), key=lambda k: -row[k])[:3], (p, t["top"])
    for a in t["top"]:
        assert abs(a["logprob"] - (row[a["id"]] - lse)) < 1e-4, (p, a)
PY
else
    bad "kiln run --prompt-logprobs exited $?: $(cat "$T/err")"
fi
expect 2 "--prompt-logprobs goes with --json" -- "$KILN" run "$T/s.kiln" --prompt-ids 1 --prompt-logprobs 1 --device cpu
expect 2 "--prompt-logprobs '-1' is not a number in 0..20" -- "$KILN" run "$T/s.kiln" --prompt-ids 1 --prompt-logprobs -1 --json
expect 2 "--logprobs goes with --json" -- "$KILN" run "$T/s.kiln" --prompt-ids 1 --logprobs 1 --device cpu
expect 2 "--logprobs '21' is not a number in 0..20" -- "$KILN" run "$T/s.kiln" --prompt-ids 1 --logprobs 21 --json

# refusals
expect 2 "give one of --text-file and --ids-file" -- "$KILN" perplexity "$E"
expect 2 "give one of --text-file and --ids-file" -- "$KILN" perplexity "$E" --text-file "$TEXT" --ids-file "$T/ids.txt"
expect 2 "--window '1' is not a number of at least 2" -- "$KILN" perplexity "$E" --text-file "$TEXT" --window 1
expect 2 "--stride 65 is longer than --window 64" -- "$KILN" perplexity "$E" --text-file "$TEXT" --window 64 --stride 65
expect 1 "--window 512 after BOS needs 513 positions; .* holds 512" -- \
    "$KILN" perplexity "$E" --text-file "$TEXT" --window 512 --bos --device cpu
expect 1 "--text-file: .*nope.txt" -- "$KILN" perplexity "$E" --text-file "$T/nope.txt" --device cpu
printf 'In' >"$T/one.txt"
expect 1 "1 token: nothing to score" -- "$KILN" perplexity "$E" --text-file "$T/one.txt" --device cpu
echo "[1, 2, 99999]" >"$T/big.json"
expect 1 "position 2: id 99999 is outside the vocabulary" -- "$KILN" perplexity "$E" --ids-file "$T/big.json" --device cpu
echo "1 2 x3" >"$T/bad.txt"
expect 1 "byte 4: 'x3' is not a token id" -- "$KILN" perplexity "$E" --ids-file "$T/bad.txt" --device cpu
expect 1 "tokenizer" -- "$KILN" perplexity "$T/s.kiln" --text-file "$TEXT" --device cpu

cli_summary

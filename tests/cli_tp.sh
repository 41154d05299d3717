#!/usr/bin/env bash
# cli_tp.sh — `kiln compile --tp N` through the binary (docs/parallelism.md):
#   - --tp values are checked before any work (exit 2), sizes that do not
#     divide are refused naming the config.json key (exit 1), leaving no file;
#   - --dump-ir shows the pass tensor-parallel and its collectives;
#   - inspect shows the ranks (text and --json);
#   - the tp=2 engine runs on the CPU and gives the tp=1 engine's tokens.
#
# usage: bash tests/cli_tp.sh KILN_EXE SOURCE_DIR SHARED_DIR
set -u
KILN=$1
SRC=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-tp-XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/lib_cli.sh"
CK="$SRC/tests/data/tiny-mistral" # 4 heads, 2 KV heads, ffn 128, vocab 256

# has PATTERN: $T/out matches (grep -E)
has() { if grep -Eq -- "$1" "$T/out"; then ok; else bad "no /$1/ in: $(head -c 400 "$T/out")"; fi; }

expect 2 "^kiln compile: error: --tp '0': expected a whole number of ranks from 1 to 64" -- \
    "$KILN" compile "$CK" -o "$T/x.kiln" --target none --tp 0
expect 2 "^kiln compile: error: --tp 'two'" -- "$KILN" compile "$CK" -o "$T/x.kiln" --target none --tp two
expect 2 "^kiln compile: error: --tp '65'" -- "$KILN" compile "$CK" -o "$T/x.kiln" --target none --tp 65
expect 1 "^kiln compile: error: --tp 3: .*num_attention_heads = 4 does not divide among 3 ranks" -- \
    "$KILN" compile "$CK" -o "$T/x.kiln" --target none --tp 3
no_file "$T/x.kiln"
expect 1 "^kiln compile: error: --tp 4: .*num_key_value_heads = 2 does not divide among 4 ranks" -- \
    "$KILN" compile "$CK" -o "$T/x.kiln" --target none --tp 4
no_file "$T/x.kiln"
expect 1 "^kiln compile: error: --tp 2: .*tiny-mixtral is a mixture of experts" -- \
    "$KILN" compile "$SRC/tests/data/tiny-mixtral" -o "$T/x.kiln" --target none --tp 2
expect 1 "^kiln compile: error: --tp 2: .*tiny-qwen3-moe is a mixture of experts" -- \
    "$KILN" compile "$SRC/tests/data/tiny-qwen3-moe" -o "$T/x.kiln" --target none --tp 2
no_file "$T/x.kiln"

"$KILN" compile "$CK" -o "$T/tp1.kiln" --target none >/dev/null 2>&1 || bad "compile tp1"
"$KILN" compile "$CK" -o "$T/tp1b.kiln" --target none --tp 1 >/dev/null 2>&1 || bad "compile --tp 1"
if cmp -s "$T/tp1.kiln" "$T/tp1b.kiln"; then ok; else bad "--tp 1 wrote other bytes than no --tp"; fi
"$KILN" compile "$CK" -o "$T/tp2.kiln" --target none --tp 2 --dump-ir >"$T/out" 2>&1 || bad "compile --tp 2"
has "^;; after tensor-parallel \([0-9]+ rewrites\)"
has "^tensor parallel: 2 ranks"
has "all_reduce\(%[0-9]+\) ranks=2"
has "all_gather\(%[0-9]+\) ranks=2 : \[B,S,256\]"
has "q_proj.weight\{rows/rank\}"
has "o_proj.weight\{cols/rank\}"
# the default fusions still run after it, on one rank's graph, and the residual add stays after the sum
has "^;; after pack-weights"
if sed -n '/after dce/,$p' "$T/out" | grep -q "linear_add"; then bad "linear_add in a tp plan"; else ok; fi

"$KILN" inspect "$T/tp2.kiln" >"$T/out" 2>&1 || bad "inspect tp2"
has "^model: MistralForCausalLM, 2 layers, hidden 64, heads 4/2 "
has "^tensor parallel: 2 ranks, each with 2 heads / 1 KV heads; weights per rank \(15 tensors each\): rank 0 \[0, [0-9]+\) .*; rank 1 \[[0-9]+, [0-9]+\)"
"$KILN" inspect "$T/tp1.kiln" >"$T/out" 2>&1
if grep -q "tensor parallel" "$T/out"; then bad "inspect of a tp=1 engine shows ranks"; else ok; fi
"$KILN" inspect "$T/tp2.kiln" --json >"$T/out.json" 2>&1 || bad "inspect --json tp2"
python3 - "$T/out.json" <<'PY' && ok || bad "inspect --json: tensor_parallel"
import json, sys
d = json.load(open(sys.argv[1]))
tp = d["tensor_parallel"]
assert tp["ranks"] == 2 and d["plan"]["ranks"] == 2, d
r = tp["rank_weights"]
assert len(r) == 2 and r[0]["offset"] == 0 and r[1]["offset"] % 4096 == 0 and r[1]["offset"] >= r[0]["bytes"], r
assert r[1]["offset"] + r[1]["bytes"] == d["weights"]["bytes"], (r, d["weights"])
assert d["plan"]["ops"]["all_reduce"] == 5 and d["plan"]["ops"]["all_gather"] == 1, d["plan"]
PY

# the same greedy tokens as tp=1, on the CPU
"$KILN" run "$T/tp1.kiln" --device cpu --prompt-ids 1,5,9,33,100,7 --max-tokens 24 >"$T/a" 2>/dev/null || bad "run tp1"
"$KILN" run "$T/tp2.kiln" --device cpu --prompt-ids 1,5,9,33,100,7 --max-tokens 24 >"$T/b" 2>/dev/null || bad "run tp2"
if [ -s "$T/a" ] && cmp -s "$T/a" "$T/b"; then ok; else bad "tp2 tokens '$(cat "$T/b")' != tp1 '$(cat "$T/a")'"; fi

cli_summary

#!/usr/bin/env bash
# cli_tp.sh — `kiln compile --tp N` through the binary (docs/parallelism.md):
#   - --tp values are checked before any work (exit 2), sizes that do not
#     divide are refused naming the config.json key (exit 1), leaving no file;
#   - --dump-ir shows the pass tensor-parallel and its collectives;
#   - inspect shows the ranks (text and --json);
#   - the tp=2 engine runs on the CPU and gives the tp=1 engine's tokens;
#   - --gpus (each rank's CUDA device) and --tp-timeout: a bad value is a
#     usage error naming the item (exit 2) in every command that makes a
#     context; a list of the wrong length (both counts named) or with
#     --device cpu is refused (exit 1); with auto a list never runs on the CPU.
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

# --gpus and --tp-timeout: checked before the engine is read, in every command that makes a context
expect 2 '^kiln run: error: --gpus "x": item 1 "x" is not a CUDA device ordinal \(a whole number 0..1023\)' -- \
    "$KILN" run "$T/tp2.kiln" --prompt-ids 1,5 --gpus x
expect 2 '^kiln run: error: --gpus "0,": item 2 is empty' -- "$KILN" run "$T/tp2.kiln" --prompt-ids 1,5 --gpus 0,
expect 2 '^kiln run: error: --gpus "0,-1": item 2 "-1" is not' -- "$KILN" run "$T/tp2.kiln" --prompt-ids 1,5 --gpus 0,-1
expect 2 '^kiln bench: error: --gpus "1024": item 1 "1024" is not' -- "$KILN" bench "$T/tp2.kiln" --gpus 1024
expect 2 '^kiln perplexity: error: --gpus " 0": item 1' -- "$KILN" perplexity "$T/tp2.kiln" --ids-file - --gpus " 0"
expect 2 '^kiln serve: error: --gpus ",0": item 1 is empty' -- "$KILN" serve "$T/tp2.kiln" --gpus ,0
expect 2 "^kiln run: error: --tp-timeout '-1' is not a number of seconds in 0..86400" -- \
    "$KILN" run "$T/tp2.kiln" --prompt-ids 1,5 --tp-timeout -1
expect 2 "^kiln serve: error: --tp-timeout 'nan'" -- "$KILN" serve "$T/tp2.kiln" --tp-timeout nan
for cmd in run bench perplexity serve; do
    "$KILN" $cmd --help | grep -q -- "--gpus LIST" && "$KILN" $cmd --help | grep -q -- "--tp-timeout S" && ok ||
        bad "$cmd --help lacks --gpus or --tp-timeout"
done
# the count against the engine's ranks, both named; a list is the GPU's
expect 1 'gpus "0" lists 1 device, but the engine has 2 tensor-parallel ranks: give 2 devices' -- \
    "$KILN" run "$T/tp2.kiln" --prompt-ids 1,5 --device gpu --gpus 0
expect 1 'gpus "0,1" lists 2 devices, but the engine has 1 rank' -- \
    "$KILN" run "$T/tp1.kiln" --prompt-ids 1,5 --gpus 0,1
expect 1 'gpus "0,1" lists GPUs, which do not apply to device "cpu"' -- \
    "$KILN" run "$T/tp2.kiln" --prompt-ids 1,5 --device cpu --gpus 0,1
# accepted: '' is the default list, a timeout is ignored on the CPU (same tokens as above)
"$KILN" run "$T/tp2.kiln" --device cpu --prompt-ids 1,5,9,33,100,7 --max-tokens 24 --gpus '' --tp-timeout 5 \
    >"$T/c" 2>/dev/null || bad "run tp2 --gpus '' --tp-timeout 5"
if cmp -s "$T/a" "$T/c"; then ok; else bad "tp2 with --gpus '' gave '$(cat "$T/c")'"; fi
# auto with a list: the GPU or an error, never the CPU (where there is no GPU: the reason, exit 1)
"$KILN" run "$T/tp2.kiln" --prompt-ids 1,5 --max-tokens 2 --gpus 0,0 --json >"$T/out" 2>"$T/err"
rc=$?
if [ $rc -ne 0 ]; then
    if [ $rc -eq 1 ] && grep -q 'does not fall back to the CPU' "$T/err"; then ok; else
        bad "auto --gpus 0,0 exited $rc: $(cat "$T/err")"; fi
elif grep -q '"device": *"gpu"' "$T/out"; then ok; else bad "auto --gpus 0,0 ran on: $(head -c 300 "$T/out")"; fi

cli_summary

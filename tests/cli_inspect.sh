#!/usr/bin/env bash
# cli_inspect.sh — what `kiln inspect`, `kiln --version`, the prompt reading of
# `kiln run` and the BOS rule of `kiln tokenize` promise, through the binary:
#   - --version prints the engine-format and kernels-section versions of the
#     headers (read from format/kiln_engine.h and format/kiln_ksec.h);
#   - run refuses unreadable and empty prompts (exit 1 naming the file and
#     the reason); only --prompt '' means BOS alone;
#   - tokenize and run --prompt add the same BOS (HF add_special_tokens=True,
#     goldens in tests/golden/tokenizer), --no-bos drops it in both;
#   - failure messages read "kiln CMD: error: ...";
#   - inspect cross-checks every section and refuses engines whose meta,
#     kernels section or tokenizer contradict the plan (engines rewritten by
#     tests/engine_edit.py), and prints dtype, targets, eos/bos, block size.
# The tokenizer and text-prompt cases need the shared pycode-22m model and
# skip (with a message) without it.
#
# usage: bash tests/cli_inspect.sh KILN_EXE SOURCE_DIR SHARED_DIR
set -u
KILN=$1
SRC=$2
SHARED=${3:-}
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-inspect-XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/lib_cli.sh"

# ---- kiln --version: the versions of the headers, not a copy of them ----
hdr() { sed -n "s/^#define $1 \([0-9]*\).*/\1/p" "$2"; }
major=$(hdr KILN_ENGINE_MAJOR "$SRC/format/kiln_engine.h")
minor=$(hdr KILN_ENGINE_MINOR "$SRC/format/kiln_engine.h")
ksec=$(hdr KILN_KSEC_VERSION "$SRC/format/kiln_ksec.h")
ver=$("$KILN" --version)
if [ -n "$major" ] && [ -n "$ksec" ] && echo "$ver" | grep -q "engine format $major\.$minor, kernels section version $ksec"; then
    ok
else
    bad "--version: '$ver' (headers say engine $major.$minor, kernels section $ksec)"
fi
commit=$(git -C "$SRC" rev-parse --short=12 HEAD 2>/dev/null)
if [ -z "$commit" ] || echo "$ver" | grep -Eq "commit [0-9a-f]{12}"; then ok; else bad "--version names no commit: '$ver'"; fi

# ---- failure messages: "kiln CMD: error: ..." for usage errors and failures ----
"$KILN" compile "$SRC/models/stories260k" -o "$T/st.kiln" 2>/dev/null || bad "compile stories260k"
expect 2 "^kiln: error: unknown command" -- "$KILN" frobnicate
expect 2 "^kiln: error: no command given" -- "$KILN"
expect 2 "^kiln run: error: unknown or incomplete option" -- "$KILN" run "$T/st.kiln" --frob
expect 2 "^kiln inspect: error: expected one engine file" -- "$KILN" inspect
expect 2 "^kiln bench: error: " -- "$KILN" bench "$T/st.kiln" --batch x
expect 2 "^kiln compile: error: " -- "$KILN" compile
expect 2 "^kiln tokenize: error: no TOKENIZER" -- "$KILN" tokenize
expect 2 "^kiln tokenize: error: unknown or incomplete option '--frob'" -- "$KILN" tokenize x --frob
expect 2 "^kiln tokenize: error: --bos and --no-bos" -- "$KILN" tokenize x --bos --no-bos
expect 2 "^kiln tokenize: error: --skip-special applies to --decode" -- "$KILN" tokenize x --skip-special
expect 1 "^kiln tokenize: error: $T/nope: no such file" -- "$KILN" tokenize "$T/nope"
expect 1 "^kiln tokenize: error: .*CMakeLists.txt" -- "$KILN" tokenize "$SRC/CMakeLists.txt"
expect 1 "^kiln inspect: error: .*nope" -- "$KILN" inspect "$T/nope"
expect 1 "^kiln tokenize: error: stdin: cannot read: it is a directory" -- "$KILN" tokenize "$SRC/fuzz/data/tiny_tokenizer.json" <"$T"
expect 1 "^kiln tokenize: error: --decode: stdin: element 1" -- "$KILN" tokenize "$SRC/fuzz/data/tiny_tokenizer.json" --decode <<<'[1, -2]'

# ---- run: prompts that cannot be read, or are empty, are refused ----
run_ids() { "$KILN" run "$T/st.kiln" --device cpu --max-tokens 1 "$@"; }
expect 1 "prompt-file: $T: not a regular file \\(a directory\\)" -- run_ids --prompt-file "$T"
expect 1 "prompt-file: $T/nope: cannot open: No such file" -- run_ids --prompt-file "$T/nope"
expect 1 "/proc/self/mem: cannot read the prompt: " -- run_ids --prompt-file /proc/self/mem
: >"$T/empty"
expect 1 "$T/empty: the prompt is empty" -- run_ids --prompt-file "$T/empty"
expect 1 "stdin: the prompt is empty.*" -- run_ids --prompt-file - <"$T/empty"
expect 1 "stdin: the prompt is empty" -- run_ids <"$T/empty"
expect 1 "stdin: cannot read the prompt: it is a directory" -- run_ids <"$T"
expect 2 "--prompt-ids '' holds no token id" -- run_ids --prompt-ids ''
expect 2 "--prompt-ids '\[ \]' holds no token id" -- run_ids --prompt-ids '[ ]'
expect 2 "--bos and --no-bos" -- run_ids --prompt x --bos --no-bos
expect 2 "apply to text prompts" -- run_ids --prompt-ids 1 --no-bos
# no tokenizer: a text prompt is refused, but --prompt '' is the engine's bos alone
expect 1 "no tokenizer" -- run_ids --prompt 'hello'
stbos=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['bos_token_id'])" "$SRC/models/stories260k/config.json")
got=$(run_ids --prompt '' --json 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['prompt_ids'])")
if [ "$got" = "[$stbos]" ]; then ok; else bad "--prompt '' without a tokenizer: prompt_ids $got, want [$stbos]"; fi
expect 1 "--no-bos leaves it out" -- run_ids --prompt '' --no-bos
# an empty prompt is refused before the engine is even opened
expect 1 "stdin: the prompt is empty" -- "$KILN" run "$T/nope.kiln" <"$T/empty"
# ids still work
expect 0 "1 tokens on cpu" -- run_ids --prompt-ids 1

PY="$SHARED/models/pycode-22m"
GT="$SRC/tests/golden/tokenizer"
if [ -d "$PY" ] && [ -d "$SHARED/tokenizers/llama2" ]; then
    "$KILN" compile "$PY" -o "$T/py.kiln" 2>/dev/null || bad "compile pycode-22m"
    # --prompt '': BOS alone, exactly the engine's bos id
    bos=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['bos_token_id'])" "$PY/config.json")
    got=$("$KILN" run "$T/py.kiln" --prompt '' --device cpu --max-tokens 1 --json 2>/dev/null |
        python3 -c "import json,sys; print(json.load(sys.stdin)['prompt_ids'])")
    if [ "$got" = "[$bos]" ]; then ok; else bad "--prompt '' gave prompt_ids $got, want [$bos]"; fi
    expect 1 "--no-bos leaves it out" -- "$KILN" run "$T/py.kiln" --prompt '' --no-bos --device cpu

    # ---- tokenize and run --prompt agree on BOS, against HF's goldens ----
    # corpus.jsonl line N is the text of llama2.jsonl line N: "ids" is HF
    # add_special_tokens=False, "ids_sp" True (tokenizers 0.23, llama2 with
    # its tokenizer_config.json; pycode-22m's tokenizer.json is the same file).
    for n in 17 18 21; do
        text=$(sed -n "${n}p" "$GT/corpus.jsonl" | python3 -c "import json,sys; sys.stdout.write(json.load(sys.stdin))")
        want_sp=$(sed -n "${n}p" "$GT/llama2.jsonl" | python3 -c "import json,sys; print(json.load(sys.stdin)['ids_sp'])")
        want=$(sed -n "${n}p" "$GT/llama2.jsonl" | python3 -c "import json,sys; print(json.load(sys.stdin)['ids'])")
        norm() { python3 -c "import json,sys; print(json.loads(sys.stdin.read()))"; }
        for tok in "$SHARED/tokenizers/llama2" "$T/py.kiln"; do
            got=$(printf '%s' "$text" | "$KILN" tokenize "$tok" | norm)
            [ "$got" = "$want_sp" ] && ok || bad "tokenize $tok (default) '$text': $got, want HF $want_sp"
            got=$(printf '%s' "$text" | "$KILN" tokenize "$tok" --bos | norm)
            [ "$got" = "$want_sp" ] && ok || bad "tokenize $tok --bos '$text': $got, want HF $want_sp"
            got=$(printf '%s' "$text" | "$KILN" tokenize "$tok" --no-bos | norm)
            [ "$got" = "$want" ] && ok || bad "tokenize $tok --no-bos '$text': $got, want HF $want"
        done
        pids() { "$KILN" run "$T/py.kiln" --device cpu --max-tokens 1 --json "$@" 2>/dev/null |
            python3 -c "import json,sys; print(json.load(sys.stdin)['prompt_ids'])"; }
        got=$(pids --prompt "$text")
        [ "$got" = "$want_sp" ] && ok || bad "run --prompt '$text': prompt_ids $got, want HF $want_sp"
        got=$(pids --prompt "$text" --no-bos)
        [ "$got" = "$want" ] && ok || bad "run --prompt '$text' --no-bos: prompt_ids $got, want HF $want"
    done
else
    echo "SKIP: tokenizer and text-prompt cases ($PY not present)"
fi

# ---- inspect: what the text output shows, from the engine's own values ----
"$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/tm.kiln" --target none 2>/dev/null || bad "compile tiny-mistral"
cfg="$SRC/tests/data/tiny-mistral/config.json"
cval() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$cfg" "$1"; }
"$KILN" inspect "$T/tm.kiln" >"$T/insp" 2>"$T/err" && ok || bad "inspect tiny-mistral: $(cat "$T/err")"
has() { if grep -Eq -- "$1" "$T/insp"; then ok; else bad "inspect output lacks /$1/: $(cat "$T/insp")"; fi; }
[ "$(cval dtype)" = bfloat16 ] && has "^weights: .*dtype bf16 \(matrices\), f32 \(norms\)"
has "^targets: none \(CPU only: it was compiled with --target none\)"
has "^kernels: none"
has "^generation: bos $(cval bos_token_id); eos $(cval eos_token_id); max_context $(cval max_position_embeddings)"
has "vocab $(cval vocab_size), context $(cval max_position_embeddings)"
# the passes' lowering decisions, as --dump-ir names them: a bf16 engine's decode RoPE only; an fp8 one's
# norms folded into its one-token GEMVs, its projections W8A8 with fast accumulation, its SwiGLUs and norms
# writing the next projection's codes (2 layers: 4 norms, 8 projections, 2 SwiGLUs)
has "^lowering: \+decode_rope×2$"
"$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/tm8.kiln" --target none --quant fp8 2>/dev/null
"$KILN" inspect "$T/tm8.kiln" >"$T/insp" 2>&1
has "^lowering: \+decode_rope×2 \+fold_into_gemv×4 \+one_token×4 \+act_fp8×8 \+out_fp8×6 \+fast_accum×8$"
"$KILN" inspect "$T/tm8.kiln" --json | python3 -c "import json,sys; f = json.load(sys.stdin)['plan']['flags']; \
assert f == {'decode_rope': 2, 'fold_into_gemv': 4, 'one_token': 4, 'act_fp8': 8, 'out_fp8': 6, 'fast_accum': 8}, f" && ok ||
    bad "inspect --json: the fp8 engine's plan.flags"
"$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/tmf.kiln" --target none --dtype f32 2>/dev/null
"$KILN" inspect "$T/tmf.kiln" >"$T/insp" 2>&1
has "^weights: .*dtype f32, codec"
"$KILN" inspect "$T/tm.kiln" --json >"$T/insp.json"
python3 - "$T/insp.json" <<'PY' && ok || bad "inspect --json lacks weights_dtype/kernels"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["weights_dtype"] == "bf16 (matrices), f32 (norms)" and d["kernels"] is None, d
PY
# act-order GPTQ: the permute ops and their i32 orders (6 without passes: q/k/v, o, gate/up and down in layer 0,
# q/k/v and down in layer 1, whose o_proj keeps its groups in order and whose gate/up are bf16; by default
# down_proj's fold into gate/up's rows and the three after norms into the norms, +out_perm: layer 0's o_proj's
# is left)
"$KILN" compile "$SRC/tests/data/tiny-mistral-gptq-actorder" -o "$T/tao.kiln" --target none 2>/dev/null
"$KILN" inspect "$T/tao.kiln" >"$T/insp" 2>&1
has "^weights: .*dtype bf16\+q4g32 \(matrices\), f32 \(norms\), i32 \(input orders\), codec"
has "^plan: .* permute×1 "
has "^lowering: \+decode_rope×2 \+out_perm×3$"
"$KILN" compile "$SRC/tests/data/tiny-mistral-gptq-actorder" -o "$T/tao0.kiln" --target none --passes none 2>/dev/null
"$KILN" inspect "$T/tao0.kiln" >"$T/insp" 2>&1
has "^plan: .* permute×6 "
# with GPU kernels (needs NVRTC): targets and the KV block size the kernels are built for
if "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/tmk.kiln" --target sm_80,compute_90 --kv-block-size 32 \
    >/dev/null 2>&1; then
    "$KILN" inspect "$T/tmk.kiln" >"$T/insp" 2>&1
    has "^targets: sm_80, compute_90$"
    has "^kernels: [0-9]+ modules \([0-9]+ distinct sources?\), [0-9]+ images, element bf16, KV block size 32 tokens"
    "$KILN" inspect "$T/tmk.kiln" --json >"$T/insp.json"
    python3 - "$T/insp.json" <<'PY' && ok || bad "inspect --json: kernels sources/images do not add up"
import json, sys
k = json.load(open(sys.argv[1]))["kernels"]
assert 1 <= k["sources"] < k["modules"] and k["images"] == 2 * k["sources"], k  # GEMVs share; 2 targets
PY
else
    echo "SKIP: inspect of an engine with kernels (this kiln has no NVRTC)"
fi
# an engine with a tokenizer names the bos/eos tokens
if [ -f "$T/py.kiln" ]; then
    "$KILN" inspect "$T/py.kiln" >"$T/insp" 2>&1
    has "^generation: bos 1 \(<s>\); eos 2 \(</s>\)"
    has "^tokenizer: 32000 ids"
fi
# a truncated engine, and a file that is no engine, are refused
head -c 100000 "$T/tm.kiln" >"$T/trunc.kiln"
expect 1 "^kiln inspect: error: .*trunc.kiln" -- "$KILN" inspect "$T/trunc.kiln"
expect 1 "^kiln inspect: error: " -- "$KILN" inspect "$cfg"

cli_summary

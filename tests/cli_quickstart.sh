#!/usr/bin/env bash
# cli_quickstart.sh — the quick-start model models/kjv-tiny, through the `kiln` binary:
#   - its tokenizer: `kiln tokenize` on models/kjv-tiny/tokenizer.json and on the
#     checkpoint directory (tokenizer_config.json: add_bos_token) gives exactly the
#     ids HF `tokenizers` gave (tests/golden/kjv-tiny/tokenizer_golden.json, made by
#     make_tokenizer_golden.py there): every third of the 579 held-out verses alone,
#     all of them joined by newlines, and 17 other strings (digits, other scripts,
#     emoji, whitespace runs, literal <s>); on the file and the directory, without and
#     with --special; and --decode gives HF's text;
#   - the model (when models/kjv-tiny/model.safetensors is present): compiled with
#     --target none, `kiln run --device cpu --temperature 0` gives HF transformers'
#     fp32 greedy ids and text for each prompt of tests/golden/kjv-tiny/golden.json
#     (made by scripts/train_quickstart.py on the training machine), and the
#     quick start's command prints that text.
# Needs only python3 (stdlib) beside kiln.
#
# usage: bash tests/cli_quickstart.sh KILN_EXE SOURCE_DIR [SHARED_DIR]
set -u
KILN=$1
SRC=$2
M="$SRC/models/kjv-tiny"
G="$SRC/tests/golden/kjv-tiny"
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-quickstart-XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/lib_cli.sh"

# ---- tokenizer: every golden case, file and directory, plain and --special, decode ----
# one python process drives kiln per case; it prints "<passed> <failed>" last
# shellcheck disable=SC2016
res=$(python3 - "$KILN" "$M" "$G/tokenizer_golden.json" <<'EOF'
import json, subprocess, sys
kiln, mdir, golden = sys.argv[1:4]
cases = json.load(open(golden, encoding="utf-8"))["cases"]
p = f = 0
def run(args, data):
    r = subprocess.run([kiln] + args, input=data, capture_output=True)
    if r.returncode != 0:
        return None, r.stderr.decode(errors="replace").strip()
    return r.stdout, None
# single verses: every third one, plain ids (each verse is also inside "heldout_all");
# the other cases: file and directory, with --no-bos (HF add_special_tokens=False) and
# --special (the default: add_special_tokens=True), and decode
for i, c in enumerate(cases):
    text = c["text"].encode("utf-8")
    single = c["kind"] == "heldout"
    if single and i % 3:
        continue
    variants = ((mdir + "/tokenizer.json", ["--no-bos"], c["ids"]),
                (mdir, ["--no-bos"], c["ids"]),
                (mdir + "/tokenizer.json", ["--special"], c.get("ids_special")),
                (mdir, ["--special"], c.get("ids_special")))
    for tok, flag, want in variants[:1] if single else variants:
        out, err = run(["tokenize", tok] + flag, text)
        got = json.loads(out) if out is not None else err
        if got == want:
            p += 1
        else:
            f += 1
            print(f"FAIL: tokenize {tok} {flag} case {i} {c['text'][:60]!r}: got {str(got)[:200]}, "
                  f"want {str(want)[:200]}", file=sys.stderr)
    if single:
        continue
    out, err = run(["tokenize", mdir + "/tokenizer.json", "--decode"], json.dumps(c["ids"]).encode())
    if out is not None and out.decode("utf-8") == c["decode"]:
        p += 1
    else:
        f += 1
        print(f"FAIL: decode case {i}: got {out if out is not None else err!r}, want {c['decode'][:200]!r}",
              file=sys.stderr)
print(p, f)
EOF
)
tp=${res% *}
tf=${res#* }
if [ -n "$res" ] && [ "$tf" = 0 ]; then
    pass=$((pass + tp))
else
    pass=$((pass + ${tp:-0}))
    bad "tokenizer: ${tf:-?} of $((${tp:-0} + ${tf:-0})) golden checks differ from HF tokenizers"
fi

# ---- the model: HF's fp32 greedy ids and text ----
if [ ! -f "$M/model.safetensors" ] || [ ! -f "$G/golden.json" ]; then
    echo "SKIP: models/kjv-tiny/model.safetensors or tests/golden/kjv-tiny/golden.json not present (model part)"
else
    if "$KILN" compile "$M" -o "$T/kjv.kiln" --target none >/dev/null 2>"$T/err"; then
        ok
        n=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['cases']))" "$G/golden.json")
        for ((i = 0; i < n; i++)); do
            field() { python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['cases'][int(sys.argv[2])][sys.argv[3]]))" "$G/golden.json" "$i" "$1"; }
            text=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['cases'][int(sys.argv[2])]['text'], end='')" "$G/golden.json" "$i")
            want_ids=$(field greedy)
            want_prompt=$(field prompt)
            want_text=$(field completion_text)
            ntok=$(python3 -c "import json,sys; print(len(json.loads(sys.argv[1])))" "$want_ids")
            got=$("$KILN" run "$T/kjv.kiln" --prompt "$text" --device cpu --temperature 0 --max-tokens "$ntok" --json 2>"$T/err")
            if python3 - "$got" "$want_prompt" "$want_ids" "$want_text" <<'EOF'
import json, sys
got = json.loads(sys.argv[1])
prompt, ids, text = (json.loads(a) for a in sys.argv[2:5])
ok = got.get("prompt_ids", prompt) == prompt and got["ids"] == ids and got["text"] == text
if not ok:
    first = next((k for k, (a, b) in enumerate(zip(got["ids"], ids)) if a != b), min(len(got["ids"]), len(ids)))
    print(f"  prompt_ids {got.get('prompt_ids')} want {prompt}; first differing id at {first}", file=sys.stderr)
sys.exit(0 if ok else 1)
EOF
            then ok; else bad "run '$text': $(head -c 300 <<<"$got") $(head -c 300 "$T/err")"; fi
        done
        # the quick start's own command (scripts/setup.sh) prints the golden text after the prompt
        case0=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['cases'][0]; print(c['text'], end='')" "$G/golden.json")
        want0=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['cases'][0]; print(c['completion_text'], end='')" "$G/golden.json")
        "$KILN" run "$T/kjv.kiln" --prompt "$case0" --max-tokens 60 --device cpu --temperature 0 >"$T/out" 2>/dev/null
        if python3 -c "import sys; got=open(sys.argv[1],encoding='utf-8').read(); sys.exit(0 if got.rstrip('\n') == sys.argv[2].rstrip('\n') else 1)" "$T/out" "$want0"; then
            ok
        else
            bad "quick start text: $(head -c 300 "$T/out")"
        fi
    else
        bad "compile models/kjv-tiny: $(cat "$T/err")"
    fi
fi

cli_summary

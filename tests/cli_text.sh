#!/usr/bin/env bash
# cli_text.sh — text in and out through the `kiln` binary, against goldens
# made by HuggingFace (tests/golden/pycode-22m from transformers,
# tests/golden/tokenizer from tokenizers):
#   - kiln tokenize on a tokenizer.json, a checkpoint dir and an engine;
#   - kiln tokenize --decode;
#   - kiln run with --prompt, --prompt-file and stdin gives HF's greedy ids
#     and text for "def fibonacci(n):" on pycode-22m.
# Skips (exit 0 with a message) when the shared models are absent.
#
# usage: bash tests/cli_text.sh KILN_EXE SOURCE_DIR SHARED_DIR
set -u
KILN=$1
SRC=$2
SHARED=$3
PY="$SHARED/models/pycode-22m"
if [ ! -d "$PY" ]; then
    echo "SKIP: $PY not present (the shared test models)"
    echo "0 passed, 0 failed"
    exit 0
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-text-XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/lib_cli.sh"

GOLDEN="$SRC/tests/golden/pycode-22m/golden.json"
# the golden's prompt ids and float32 greedy ids for case 0 ("def fibonacci(n):")
want_prompt=$(python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['cases'][0]['prompt']))" "$GOLDEN")
want_ids=$(python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['cases'][0]['float32']['greedy']))" "$GOLDEN")
want_text=$(python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['cases'][0]['float32']['completion_text']))" "$GOLDEN")

same_ids() { # same_ids JSON_A JSON_B
    python3 -c "import json,sys; sys.exit(0 if json.loads(sys.argv[1]) == json.loads(sys.argv[2]) else 1)" "$1" "$2"
}

# ---- tokenize: three kinds of TOKENIZER argument ----
"$KILN" compile "$PY" -o "$T/py.kiln" 2>/dev/null || bad "compile pycode-22m"
for tok in "$PY/tokenizer.json" "$PY" "$T/py.kiln"; do
    got=$(printf 'def fibonacci(n):' | "$KILN" tokenize "$tok" --special)
    if same_ids "$got" "$want_prompt"; then ok; else bad "tokenize $tok: $got, want $want_prompt"; fi
done
# decode round trip
text=$(echo "[1, 801, 16182, 266, 28127, 28732, 28711, 1329]" | "$KILN" tokenize "$PY/tokenizer.json" --decode --skip-special)
if [ "$text" = "def fibonacci(n):" ]; then ok; else bad "decode gave '$text'"; fi
# invalid UTF-8 is refused with a message naming the offset
printf 'ab\xffcd' | "$KILN" tokenize "$PY/tokenizer.json" >/dev/null 2>"$T/err"
rc=$?
if [ $rc -eq 1 ] && grep -qi "utf-8" "$T/err"; then ok; else bad "invalid UTF-8: exit $rc, $(cat "$T/err")"; fi

# ---- run: --prompt, --prompt-file, stdin ----
check_run() { # check_run LABEL JSON
    local ids text
    ids=$(python3 -c "import json,sys; print(json.dumps(json.loads(sys.argv[1])['ids']))" "$2" 2>/dev/null)
    text=$(python3 -c "import json,sys; print(json.dumps(json.loads(sys.argv[1])['text']))" "$2" 2>/dev/null)
    if same_ids "$ids" "$want_ids" && [ "$text" = "$want_text" ]; then ok; else bad "$1: ids $ids text $text"; fi
}
args=(--device cpu --max-tokens 40 --temperature 0 --json)
check_run "--prompt" "$("$KILN" run "$T/py.kiln" --prompt "def fibonacci(n):" "${args[@]}")"
printf 'def fibonacci(n):' >"$T/prompt.txt"
check_run "--prompt-file" "$("$KILN" run "$T/py.kiln" --prompt-file "$T/prompt.txt" "${args[@]}")"
check_run "stdin" "$(printf 'def fibonacci(n):' | "$KILN" run "$T/py.kiln" "${args[@]}")"
# streamed text (no --json) is the same text, after the prompt-less completion
"$KILN" run "$T/py.kiln" --prompt "def fibonacci(n):" --device cpu --max-tokens 40 --temperature 0 >"$T/stream" 2>/dev/null
if python3 -c "import json,sys; sys.exit(0 if open(sys.argv[1]).read() == json.loads(sys.argv[2]) + '\n' else 1)" "$T/stream" "$want_text"; then
    ok
else
    bad "streamed text differs: $(head -c 200 "$T/stream")"
fi

cli_summary

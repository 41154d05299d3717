#!/usr/bin/env bash
# cli_kiln_run.sh — `kiln-run`, the runtime-only tool, through the binary:
# --help lists its runtime commands only, compile is refused with a hint, and
# run / inspect / bench / tokenize on an engine give what `kiln` gives
# (stories260k on the CPU; tokenize with pycode-22m's tokenizer); a
# tokenizer.json is refused with a hint pointing at `kiln tokenize`.
#
# usage: bash tests/cli_kiln_run.sh KILN_EXE SOURCE_DIR [SHARED_DIR]
# (kiln-run is the kiln-run beside KILN_EXE)
set -u
KILN=$1
SRC=$2
SHARED=${3:-$SRC/../shared}
RUN=$(dirname "$KILN")/kiln-run
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-cli-run-XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/lib_cli.sh"

[ -x "$RUN" ] || { echo "FAIL: $RUN not built" >&2; exit 1; }

# --help: exactly run, bench, inspect, tokenize
"$RUN" --help >"$T/help" 2>&1 || bad "kiln-run --help exited $?"
cmds=$(sed -n 's/^  \([a-z]*\)  .*/\1/p' "$T/help" | tr '\n' ' ')
[ "$cmds" = "run bench inspect tokenize serve perplexity tune " ] && ok || bad "kiln-run --help lists '$cmds'"
"$RUN" --version | grep -Eq '^kiln-run [0-9]+\.[0-9]+\.[0-9]+ ' && ok || bad "kiln-run --version"
expect 2 "hint: compile engines with .kiln compile." -- "$RUN" compile x -o y.kiln
expect 2 "unknown command 'frobnicate'" -- "$RUN" frobnicate
expect 2 "usage: kiln-run" -- "$RUN"
# each command's help names the tool it runs under
for c in run bench inspect serve perplexity tune; do
    "$RUN" $c --help 2>&1 | head -1 | grep -q "^usage: kiln-run $c " && ok || bad "kiln-run $c --help does not say 'usage: kiln-run $c'"
done

# run / inspect / bench on stories260k, the same as kiln's
"$KILN" compile "$SHARED/models/stories260k" -o "$T/s.kiln" --target none >/dev/null 2>&1 || bad "compile stories260k"
"$RUN" run "$T/s.kiln" --device cpu --prompt-ids 1 --max-tokens 10 --json >"$T/run.json" 2>"$T/err" ||
    bad "kiln-run run exited $?: $(cat "$T/err")"
grep -q '"ids":\[461,461,401,401,401,461,378,455,473,456\]' "$T/run.json" && ok ||
    bad "kiln-run run: not HF's greedy ids: $(cat "$T/run.json")"
"$RUN" inspect "$T/s.kiln" --json >"$T/i1" 2>&1 || bad "kiln-run inspect exited $?"
"$KILN" inspect "$T/s.kiln" --json >"$T/i2" 2>&1
cmp -s "$T/i1" "$T/i2" && ok || bad "kiln-run inspect --json differs from kiln inspect --json"
"$RUN" bench "$T/s.kiln" --device cpu --threads 1 --input-len 8 --output-len 4 --reps 1 --warmup 0 --json \
    >"$T/bench" 2>"$T/err" && grep -q '"metric"' "$T/bench" && ok || bad "kiln-run bench: $(cat "$T/err")"
expect 1 "kiln run: error" -- "$RUN" run "$T/nonexistent.kiln" --prompt-ids 1
expect 2 'kiln run: error: --gpus "x": item 1 "x" is not a CUDA device ordinal' -- "$RUN" run "$T/s.kiln" --prompt-ids 1 --gpus x
expect 1 'gpus "0" lists GPUs, which do not apply to device "cpu"' -- "$RUN" bench "$T/s.kiln" --device cpu --gpus 0

# tokenize: an engine's tokenizer, as kiln's; tokenizer.json and directories refused with a hint
tok=$SHARED/models/pycode-22m
if [ -f "$tok/tokenizer.json" ]; then
    "$KILN" compile "$tok" -o "$T/py.kiln" --target none >/dev/null 2>&1 || bad "compile pycode-22m"
    printf 'def fibonacci(n):\n    return n' >"$T/text"
    "$RUN" tokenize "$T/py.kiln" <"$T/text" >"$T/t1" 2>"$T/err" || bad "kiln-run tokenize: $(cat "$T/err")"
    "$KILN" tokenize "$tok/tokenizer.json" <"$T/text" >"$T/t2" 2>&1
    cmp -s "$T/t1" "$T/t2" && [ -s "$T/t1" ] && ok || bad "kiln-run tokenize ENGINE differs from kiln tokenize tokenizer.json"
    "$RUN" tokenize "$T/py.kiln" --no-bos <"$T/text" >"$T/t3" 2>&1
    "$RUN" tokenize "$T/py.kiln" --decode <"$T/t3" >"$T/back" 2>&1 && cmp -s "$T/back" "$T/text" && ok ||
        bad "kiln-run tokenize --decode did not give the text back"
    expect 1 "is not an engine file, and kiln-run reads engines' tokenizers only" -- "$RUN" tokenize "$tok/tokenizer.json"
    grep -q "hint: for a tokenizer.json or a checkpoint, use .kiln tokenize" "$T/err" && ok || bad "tokenize hint"
    expect 1 "is not an engine file" -- "$RUN" tokenize "$tok"
    "$RUN" tokenize --help | grep -q "TOKENIZER must be an engine file" && ok || bad "kiln-run tokenize --help"
else
    echo "skip: $tok/tokenizer.json not found (tokenize checks)"
fi

cli_summary

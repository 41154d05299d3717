#!/usr/bin/env bash
# cli_chat.sh — chat templates through the `kiln` binary:
#   - kiln compile stores a checkpoint's chat_template.jinja (a chat section);
#   - kiln run --chat gives HF apply_chat_template(tokenize=True)'s ids
#     (tests/golden/chat/golden.json, "encode"), with no extra bos;
#   - the template's raise_exception is an error naming its message;
#   - --no-chat-template leaves it out, and run --chat then says so;
#   - a template outside kiln's subset is refused at compile time by name,
#     leaving no engine; usage errors of --chat / --system.
# Skips (exit 0 with a message) when the shared model is absent.
#
# usage: bash tests/cli_chat.sh KILN_EXE SOURCE_DIR SHARED_DIR
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
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-chat-XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/lib_cli.sh"
GOLDEN="$SRC/tests/golden/chat/golden.json"

mkdir "$T/ck"
for f in "$PY"/*; do ln -s "$f" "$T/ck/"; done
cp "$SRC/tests/golden/chat/mistral.jinja" "$T/ck/chat_template.jinja"
"$KILN" compile "$T/ck" -o "$T/chat.kiln" >/dev/null 2>&1 || bad "compile with a chat template"
"$KILN" inspect "$T/chat.kiln" | grep -q "^  chat " && ok || bad "inspect lists no chat section"

for i in 0 1; do
    prompt=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['encode'][int(sys.argv[2])]['prompt'])" "$GOLDEN" $i)
    want=$(python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['encode'][int(sys.argv[2])]['ids']))" "$GOLDEN" $i)
    got=$("$KILN" run "$T/chat.kiln" --chat --prompt "$prompt" --max-tokens 0 --device cpu --json 2>"$T/err" |
        python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)['prompt_ids']))")
    [ "$got" = "$want" ] && ok || bad "run --chat '$prompt': prompt ids $got, want $want ($(cat "$T/err"))"
done

"$KILN" run "$T/chat.kiln" --chat --system "Be brief." --prompt "hi" --max-tokens 0 --device cpu >/dev/null 2>"$T/err"
[ $? -eq 1 ] && grep -q "raise_exception: Conversation roles must alternate" "$T/err" && ok ||
    bad "a system message with Mistral's template: $(cat "$T/err")"

"$KILN" compile "$T/ck" --no-chat-template -o "$T/plain.kiln" >/dev/null 2>&1 || bad "compile --no-chat-template"
"$KILN" inspect "$T/plain.kiln" | grep -q "^  chat " && bad "--no-chat-template kept the section" || ok
"$KILN" run "$T/plain.kiln" --chat --prompt "hi" --max-tokens 0 --device cpu >/dev/null 2>"$T/err"
[ $? -eq 1 ] && grep -q "has no chat template" "$T/err" && ok || bad "run --chat without a template: $(cat "$T/err")"

printf '{%% for m in messages %%}{{ m.content }}\n{{ messages|groupby("role") }}{%% endfor %%}' >"$T/ck/chat_template.jinja"
"$KILN" compile "$T/ck" -o "$T/bad.kiln" >/dev/null 2>"$T/err"
[ $? -eq 1 ] && grep -q "line 2: filter 'groupby' is not supported" "$T/err" && grep -q "no-chat-template" "$T/err" &&
    [ ! -e "$T/bad.kiln" ] && ok || bad "unsupported template at compile time: $(cat "$T/err")"
"$KILN" compile "$T/ck" --no-chat-template -o "$T/bad.kiln" >/dev/null 2>&1 && ok || bad "--no-chat-template skips a bad template"

for args in "--system x --prompt hi" "--chat --prompt-ids 1,2" "--chat --no-special --prompt hi"; do
    # shellcheck disable=SC2086
    "$KILN" run "$T/chat.kiln" $args >/dev/null 2>&1
    [ $? -eq 2 ] && ok || bad "usage error expected for: $args"
done

cli_summary

#!/usr/bin/env bash
# cli_serve.sh — `kiln serve`, the OpenAI-compatible HTTP server, on the CPU
# executor with models/kjv-tiny (one engine with a chat template, one without):
#   - completions plain and streamed give the same text as `kiln run
#     --temperature 0`, chat as `kiln run --chat`; usage counts match;
#   - a stop string spanning tokens cuts the text there (finish_reason stop);
#   - 400 (malformed JSON, an unsupported field, a prompt over the context,
#     chat without a template), 401, 404, 405, 429 with Retry-After;
#   - /v1/models, /tokenize + /detokenize, /metrics in Prometheus text;
#   - a client that disconnects cancels its request; SIGTERM drains, exit 0;
#   - the queue checks run on kiln-run (the runtime alone) when it is built;
#   - through the `openai` Python package when it can be installed (else a
#     SKIP line for that part).
# Servers listen on 127.0.0.1 on a free port and are always stopped.
# KILN_TEST_DEVICE=gpu KILN_TEST_TARGET=sm_90 runs the same checks on a GPU.
#
# usage: bash tests/cli_serve.sh KILN_EXE SOURCE_DIR [SHARED_DIR]
set -u
KILN=$1
SRC=$(cd "$2" && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-serve-XXXXXX")
trap 'for p in "$T"/*.pid; do [ -f "$p" ] && kill -KILL "$(cat "$p")" 2>/dev/null; done; rm -rf "$T"' EXIT

"$KILN" compile "$SRC/models/kjv-tiny" --target "${KILN_TEST_TARGET:-none}" -o "$T/kjv.kiln" >/dev/null 2>"$T/err" || {
    cat "$T/err" >&2
    echo "FAIL: compile kjv-tiny"
    echo "0 passed, 1 failed"
    exit 1
}
mkdir "$T/ck"
for f in "$SRC/models/kjv-tiny"/*; do ln -s "$f" "$T/ck/"; done
cp "$SRC/tests/golden/chat/chatml.jinja" "$T/ck/chat_template.jinja"
"$KILN" compile "$T/ck" --target "${KILN_TEST_TARGET:-none}" -o "$T/chat.kiln" >/dev/null 2>&1 || echo "FAIL: compile with a chat template" >&2

# The openai package, for the client part (tests only): skip that part when it cannot be installed.
if ! python3 -c "import openai" 2>/dev/null; then
    timeout 120 python3 -m pip install -q --break-system-packages openai >/dev/null 2>&1 ||
        timeout 120 python3 -m pip install -q openai >/dev/null 2>&1 || true
fi

timeout 540 python3 "$SRC/tests/serve_check.py" "$KILN" "$T"

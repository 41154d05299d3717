#!/usr/bin/env bash
# cli_serve_load.sh — bench/serve_load.py, the load generator, against
# `kiln serve --device cpu` on models/kjv-tiny and against a fake server:
#   - closed loop (concurrency 4), Poisson open loop (lognormal lengths) and a
#     --sla-ttft-ms run over two rates: every request ok, output tokens =
#     the max_tokens asked (ignore_eos), prompt tokens as sent, percentiles
#     ordered, throughput > 0, the SLA's best rate as the runs say;
#   - a fake server speaking llama-server's dialect (usage and timings in the
#     last content chunk, a token with empty text, close-delimited body) is
#     counted right; its broken streams (no usage, short usage, no [DONE],
#     bad JSON, an error event, HTTP 500, a stalled stream) fail with the
#     reason, exit 1;
#   - a wrong URL and a server killed mid-run: failures counted, exit 1,
#     never a hang; bad options exit 2.
# Servers listen on 127.0.0.1 on free ports and are always stopped.
#
# usage: bash tests/cli_serve_load.sh KILN_EXE SOURCE_DIR [SHARED_DIR]
set -u
KILN=$1
SRC=$(cd "$2" && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-serve-load-XXXXXX")
trap 'for p in "$T"/*.pid; do [ -f "$p" ] && kill -KILL "$(cat "$p")" 2>/dev/null; done; rm -rf "$T"' EXIT
. "$SRC/tests/lib_cli.sh"
LOAD="$SRC/bench/serve_load.py"

"$KILN" compile "$SRC/models/kjv-tiny" --target none -o "$T/kjv.kiln" >/dev/null 2>"$T/err" || {
    cat "$T/err" >&2
    bad "compile kjv-tiny"
    cli_summary
    exit 1
}

# start_kiln NAME: kiln serve on a free port (--port 0); sets PORT, writes $T/NAME.pid and $T/NAME.log
start_kiln() {
    "$KILN" serve "$T/kjv.kiln" --device cpu --host 127.0.0.1 --port 0 --max-batch 4 --max-queue 256 \
        --threads 2 --model-name kjv >"$T/$1.log" 2>&1 &
    echo $! >"$T/$1.pid"
    disown
    PORT=
    for _ in $(seq 600); do  # 60 s: an ASan build loads slowly
        PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$T/$1.log")
        if [ -n "$PORT" ] && python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" \
            2>/dev/null; then
            return 0
        fi
        kill -0 "$(cat "$T/$1.pid")" 2>/dev/null || break
        sleep 0.1
    done
    bad "kiln serve did not become ready:" "$(cat "$T/$1.log")"
    return 1
}

# load RC NAME ARGS...: run serve_load.py (never over 120 s) writing $T/NAME.json; its exit status must be RC
load() {
    local want=$1 name=$2
    shift 2
    timeout 120 python3 "$LOAD" --json "$T/$name.json" "$@" >"$T/$name.out" 2>&1
    local rc=$?
    if [ "$rc" -ne "$want" ]; then
        bad "serve_load.py $* -> exit $rc (want $want):" "$(tail -20 "$T/$name.out")"
        return 1
    fi
    ok
}

# check NAME PYTHON-CONDITIONS: each line of conditions, on d (the JSON) and m (the measured runs), must hold
check() {
    python3 - "$T/$1.json" "$2" <<'EOF' || { bad "$1.json: the conditions above"; return 1; }
import json, sys
d = json.load(open(sys.argv[1]))
m = [r for r in d["runs"] if r.get("phase") == "measure"]
def ordered(r):
    return all(r[k]["n"] == 0 or r[k]["min"] <= r[k]["p50"] <= r[k]["p90"] <= r[k]["p99"] <= r[k]["max"]
               for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"))
bad = [c for c in sys.argv[2].strip().splitlines() if not eval(c.strip())]
for c in bad:
    print("  condition false:", c.strip(), file=sys.stderr)
if bad:
    print("  runs:", json.dumps([{k: v for k, v in r.items() if k != "per_request"} for r in d["runs"]])[:3000],
          file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
    [ $? -eq 0 ] && ok
}

start_kiln serve || { cli_summary; exit 1; }
URL=http://127.0.0.1:$PORT
COMMON="--url $URL --vocab 4096 --timeout 60"

# closed loop: 4 clients, 12 measured requests of 16 prompt tokens and 8 new ones, after 2 warm-up requests
load 0 closed $COMMON --concurrency 4 --requests 12 --warmup 2 --input-len 16 --output-len 8 --per-request &&
    check closed '
        d["all_ok"] and d["settings"]["model"] == "kjv" and len(m) == 1 and d["runs"][0]["phase"] == "warmup"
        m[0]["requests"] == 12 and m[0]["ok"] == 12 and m[0]["failed"] == 0 and m[0]["concurrency"] == 4
        m[0]["output_tokens"] == 12 * 8 and m[0]["input_tokens"] == 12 * 16 and m[0]["token_count_from"] == ["usage"]
        all(r["output_tokens"] == 8 and r["prompt_tokens"] == 16 and r["finish_reason"] == "length" for r in m[0]["per_request"])
        m[0]["ttft_ms"]["n"] == 12 and m[0]["tpot_ms"]["n"] == 12 and m[0]["itl_ms"]["n"] > 0 and ordered(m[0])
        all(r["ttft"] <= r["e2e"] for r in m[0]["per_request"])
        m[0]["output_tok_per_s"] > 0 and m[0]["req_per_s"] > 0 and m[0]["duration_s"] > 0
        m[0]["e2e_ms"]["p50"] >= m[0]["ttft_ms"]["p50"]'
grep -q "c=4 " "$T/closed.out" && grep -q "TTFT p50" "$T/closed.out" || bad "closed: no table on stdout"

# open loop: Poisson at 10 req/s, at most 4 in flight, lognormal lengths (each request still gets its max_tokens)
load 0 poisson $COMMON --rate 10 --max-inflight 4 --requests 10 --input-len 12 --output-len 6 \
    --len-dist lognormal --sigma 0.6 --max-input-len 40 --max-output-len 20 --seed 3 --per-request &&
    check poisson '
        m[0]["ok"] == 10 and m[0]["rate"] == 10 and ordered(m[0]) and m[0]["output_tok_per_s"] > 0
        m[0]["output_tokens"] == m[0]["max_tokens_total"] == sum(r["max_tokens"] for r in m[0]["per_request"])
        all(r["output_tokens"] == r["max_tokens"] and r["prompt_tokens"] == r["input_len"] for r in m[0]["per_request"])
        all(1 <= r["max_tokens"] <= 20 and 1 <= r["input_len"] <= 40 for r in m[0]["per_request"])
        len({r["max_tokens"] for r in m[0]["per_request"]}) > 1'

# SLA over two rates: a generous SLA keeps both (best = the higher), an impossible one none (still exit 0)
load 0 sla $COMMON --sla-ttft-ms 100000 --rates 2,4 --requests 6 --input-len 8 --output-len 4 &&
    check sla '
        [r["rate"] for r in m] == [2, 4] and all(r["ok"] == 6 for r in m)
        d["sla"]["best_rate"] == 4 and [t["meets"] for t in d["sla"]["tried"]] == [True, True]
        all(t["ttft_p99_ms"] == r["ttft_ms"]["p99"] for t, r in zip(d["sla"]["tried"], m))'
load 0 sla-none $COMMON --sla-ttft-ms 0.001 --rates 2,4 --requests 4 --input-len 8 --output-len 4 &&
    check sla-none '
        d["sla"]["best_rate"] is None and len(m) == 1 and m[0]["ok"] == 4'

# a wrong model: HTTP 404 for every request, the server's reason kept
load 1 wrong-model $COMMON --model nope --concurrency 2 --requests 3 --input-len 4 --output-len 2 &&
    check wrong-model '
        m[0]["failed"] == 3 and m[0]["ok"] == 0 and not d["all_ok"]
        all(k.startswith("HTTP 404") for k in m[0]["failure_reasons"])'

# bad options: exit 2 before any request
for opts in "--concurrency 0" "--rate -1" "--rates 1,x" "--url ftp://h" "--vocab 4096 --id-low 5000" \
    "--concurrency 2 --sla-ttft-ms 10" "--rate 1 --concurrency 2" "--extra-body [1]" "--len-dist zipf"; do
    # shellcheck disable=SC2086
    timeout 30 python3 "$LOAD" --url "$URL" $opts >"$T/opt.out" 2>&1
    rc=$?
    [ "$rc" -eq 2 ] && ok || bad "serve_load.py $opts -> exit $rc (want 2)"
done

# a server killed in the middle of a run: the requests it held fail (closed mid-stream), exit 1, no hang
start_kiln victim || { cli_summary; exit 1; }
timeout 120 python3 "$LOAD" --url "http://127.0.0.1:$PORT" --vocab 4096 --timeout 30 --concurrency 4 --requests 400 \
    --input-len 8 --output-len 200 --json "$T/killed.json" >"$T/killed.out" 2>&1 &
lp=$!
sleep 1.5
kill -KILL "$(cat "$T/victim.pid")"
wait $lp
rc=$?
[ "$rc" -eq 1 ] && ok || bad "serve_load.py against a killed server -> exit $rc (want 1): $(tail -5 "$T/killed.out")"
[ -f "$T/killed.json" ] && check killed '
    m[0]["failed"] >= 1 and m[0]["ok"] + m[0]["failed"] == 400
    any("connect" in k or "closed" in k or "DONE" in k for k in m[0]["failure_reasons"])'

# the stopped server's port, and a port nobody listens on: every request fails, exit 1
load 1 stopped --url "http://127.0.0.1:$PORT" --model kjv --vocab 4096 --concurrency 2 --requests 4 --timeout 10 &&
    check stopped 'm[0]["failed"] == 4 and all(k.startswith("connect") for k in m[0]["failure_reasons"])'
kill -TERM "$(cat "$T/serve.pid")"

# a fake server in llama-server's dialect, and broken streams (the URL's first path segment picks one)
cat >"$T/fake.py" <<'EOF'
import http.server, json, sys, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # a close-delimited body
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(404)
        self.end_headers()
    def do_POST(self):
        mode = self.path.strip("/").split("/")[0]
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = req["max_tokens"]
        if mode == "err500":
            body = json.dumps({"error": {"message": "boom", "code": 500}}).encode()
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        def ev(o):
            self.wfile.write(b"data: " + (o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n\n")
            self.wfile.flush()
        def chunk(text, finish=None, **kw):
            o = {"choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
                 "object": "text_completion"}
            o.update(kw)
            return o
        if mode == "hang":
            ev(chunk("a"))
            time.sleep(30)
            return
        usage = {"completion_tokens": n - (mode == "short"), "prompt_tokens": len(req["prompt"])}
        for i in range(n - 1):  # one chunk per token; the second has empty text (inside a UTF-8 sequence)
            ev(chunk("" if i == 1 else "t%d" % i))
            time.sleep(0.002)
            if mode == "garbage" and i == 1:
                ev(b"{not json")
            if mode == "errevent" and i == 1:
                ev({"error": {"message": "generation failed"}})
        if mode == "nousage":
            ev(chunk("z"))
            ev(chunk("", "length"))
        else:  # llama-server: the last token, finish_reason, usage and timings in one chunk
            ev(chunk("z", "length", usage=usage, timings={"predicted_n": n}))
        if mode != "nodone":
            ev(b"[DONE]")
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
EOF
python3 "$T/fake.py" >"$T/fake.port" 2>"$T/fake.log" &
echo $! >"$T/fake.pid"
disown
for _ in $(seq 100); do [ -s "$T/fake.port" ] && break; sleep 0.05; done
FAKE=http://127.0.0.1:$(cat "$T/fake.port")
FC="--model m --concurrency 3 --requests 6 --input-len 5 --output-len 7 --timeout 3"
load 0 fake-llama --url "$FAKE/llama" $FC &&
    check fake-llama '
        m[0]["ok"] == 6 and m[0]["output_tokens"] == 42 and m[0]["token_count_from"] == ["usage"] and ordered(m[0])
        m[0]["tpot_ms"]["n"] == 6 and m[0]["itl_ms"]["n"] == 6 * 6'
load 0 fake-nousage --url "$FAKE/nousage" $FC &&
    check fake-nousage 'm[0]["ok"] == 6 and m[0]["output_tokens"] == 42 and m[0]["token_count_from"] == ["chunks"]'
for f in "short:!= max_tokens 7" "nodone:without data: \[DONE\]" "garbage:malformed SSE data" \
    "errevent:error event: generation failed" "err500:HTTP 500: boom" "hang:timeout after 3"; do
    mode=${f%%:*}
    load 1 "fake-$mode" --url "$FAKE/$mode" $FC &&
        check "fake-$mode" "
            m[0]['failed'] == 6 and list(m[0]['failure_reasons']) and __import__('re').search(r'''${f#*:}''', list(m[0]['failure_reasons'])[0])"
done

cli_summary

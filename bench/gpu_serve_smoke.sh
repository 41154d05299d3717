#!/usr/bin/env bash
# gpu_serve_smoke.sh — kiln serve on the GPU, end to end: `kiln-run serve`
# on an engine with a tokenizer, one completion (plain and streamed) and one
# chat-free request checked against `kiln-run run` on the same GPU (greedy,
# the same text), /metrics scraped, then SIGTERM: the server drains and
# exits 0. Writes $OUT/serve_smoke.txt with a CHECK line per claim.
#
#     BIN=.carry/x/bin ENGINE=/tmp/kiln-deploy/text.kiln bash bench/gpu_serve_smoke.sh
# (the engine from bench/gpu_deploy_run.sh, or any engine with a tokenizer; ARGS: more options for both
# serve and run, e.g. ARGS="--gpus 0,0" for a tensor-parallel engine with every rank on GPU 0)
set -u
BIN=${BIN:-build-rel}
ENGINE=${ENGINE:?an engine with a tokenizer}
OUT=${OUT:-out}
PORT=${PORT:-18473}
PROMPT=${PROMPT:-And God said}
N=${N:-24}
ARGS=${ARGS:-}
mkdir -p "$OUT"
R="$OUT/serve_smoke.txt"
: >"$R"
check() { if eval "$2"; then echo "CHECK PASS: $1" | tee -a "$R"; else echo "CHECK FAIL: $1" | tee -a "$R"; fi; }

"$BIN/kiln-run" serve "$ENGINE" --device gpu $ARGS --port "$PORT" --model-name m >"$OUT/serve.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" \
        2>/dev/null && break
    sleep 0.2
done
want=$("$BIN/kiln-run" run "$ENGINE" --prompt "$PROMPT" --max-tokens "$N" --temperature 0 --device gpu $ARGS --json |
       python3 -c 'import json, sys; print(json.load(sys.stdin)["text"])')
python3 - "$PORT" "$PROMPT" "$N" "$want" >>"$R" 2>&1 <<'EOF'
import json, sys, urllib.request
port, prompt, n, want = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def post(body, stream=False):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode()
plain = json.loads(post({"model": "m", "prompt": prompt, "max_tokens": n, "temperature": 0}))
text = plain["choices"][0]["text"]
print("CHECK %s: served text equals kiln-run run's on the GPU (%r)" % ("PASS" if text == want else "FAIL", text[:80]))
chunks = [l[6:] for l in post({"model": "m", "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True},
                              True).splitlines() if l.startswith("data: ")]
streamed = "".join(json.loads(c)["choices"][0]["text"] for c in chunks if c != "[DONE]" and json.loads(c)["choices"])
print("CHECK %s: streamed text equals the plain response" % ("PASS" if streamed == text else "FAIL"))
print("CHECK %s: usage %s" % ("PASS" if plain["usage"]["completion_tokens"] == n else "FAIL", plain["usage"]))
m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
print("CHECK %s: /metrics has kiln_ lines" % ("PASS" if any(l.startswith("kiln_") for l in m.splitlines()) else "FAIL"))
EOF
kill -TERM "$pid"
wait "$pid"
rc=$?
check "SIGTERM: the server drained and exited 0 (rc $rc)" '[ "$rc" -eq 0 ]'
cat "$R"

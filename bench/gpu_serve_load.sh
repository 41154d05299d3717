#!/usr/bin/env bash
# gpu_serve_load.sh — kiln serve against llama.cpp's llama-server under load,
# on one GPU, with bench/serve_load.py: a random-weight Mistral-7B (bf16, the
# llama2 tokenizer) compiled for kiln and converted to a bf16 GGUF, both
# servers with 64 slots, closed loops at concurrency 1 and 64 (512 prompt
# tokens, 128 new, greedy, ignore_eos), optionally a Poisson rate sweep for
# the largest rate with P99 TTFT under 200 ms. Results (serve_load JSON,
# server logs, summary.md) go under $OUT.
#
# Run from the repository root, in parts that each fit one 10-minute command
# (files persist between commands in /tmp while the machine stays warm; $OUT
# may be a fresh folder each time, so every step copies all results so far
# from /tmp/gsl/results into it and rewrites summary.md):
#
#   bash bench/gpu_serve_load.sh --step prep    # checkpoint, kiln compile + GGUF conversion (in parallel)
#   bash bench/gpu_serve_load.sh --step kiln    # kiln serve: c=1 and c=64
#   bash bench/gpu_serve_load.sh --step llama   # llama-server: the same
#   bash bench/gpu_serve_load.sh --step sweep   # both: Poisson rates, --sla-ttft-ms
#   bash bench/gpu_serve_load.sh --step summary # summary.md from what is there
#   bash bench/gpu_serve_load.sh --step all     # all of the above in turn, each under its own budget
#
# Carried in (defaults): .carry/bin/kiln (Release, CUDA), .carry/llama/llama-server,
# .carry/llama/convert (scripts/carry_llama_convert.sh), .carry/tok/llama2
# (tokenizer.json, tokenizer_config.json).
#
# Options: --budget S (seconds per step, default 540), --kiln BIN, --llama-server BIN,
# --convert DIR, --tok DIR, --layers N (a partial model, for a quick try),
# --fresh (remake checkpoint, engine and GGUF), --input-len 512, --output-len 128,
# --c1-requests 16, --c64-requests 256, --rates 2,4,8,16,32, --sweep-requests 64,
# --sla-ttft-ms 200, --target sm_90 (kiln compile's), --slots 64 (the high concurrency,
# kiln's --max-batch and llama-server's -np), --device gpu (kiln serve's; cpu only to try
# the plumbing on a machine without a GPU, with --target none and small lengths).
#
# Disk: checkpoint, engine and GGUF are ~14.5 GB each (44 GB of the 64 GB).
# Every command runs under `timeout`, servers are polled on /health with a
# deadline and are always stopped at exit (SIGTERM, then SIGKILL).
set -u
STEP=all
BUDGET=540
KILN=.carry/bin/kiln
LLAMA=.carry/llama/llama-server
CONVERT=.carry/llama/convert
TOK=.carry/tok/llama2
LAYERS=
FRESH=0
IN=512
OUTLEN=128
C1_REQ=16
C64_REQ=256
RATES=2,4,8,16,32
SWEEP_REQ=64
SLA_MS=200
TARGET=sm_90
SLOTS=64
DEVICE=gpu
while [ $# -gt 0 ]; do
    case $1 in
        --step) STEP=$2; shift 2 ;;
        --budget) BUDGET=$2; shift 2 ;;
        --kiln) KILN=$2; shift 2 ;;
        --llama-server) LLAMA=$2; shift 2 ;;
        --convert) CONVERT=$2; shift 2 ;;
        --tok) TOK=$2; shift 2 ;;
        --layers) LAYERS=$2; shift 2 ;;
        --fresh) FRESH=1; shift ;;
        --input-len) IN=$2; shift 2 ;;
        --output-len) OUTLEN=$2; shift 2 ;;
        --c1-requests) C1_REQ=$2; shift 2 ;;
        --c64-requests) C64_REQ=$2; shift 2 ;;
        --rates) RATES=$2; shift 2 ;;
        --sweep-requests) SWEEP_REQ=$2; shift 2 ;;
        --sla-ttft-ms) SLA_MS=$2; shift 2 ;;
        --target) TARGET=$2; shift 2 ;;
        --slots) SLOTS=$2; shift 2 ;;
        --device) DEVICE=$2; shift 2 ;;
        -h | --help) sed -n '2,40p' "$0"; exit 0 ;;
        *) echo "gpu_serve_load: unknown option $1 (--help)" >&2; exit 2 ;;
    esac
done
case $STEP in prep | kiln | llama | sweep | summary | all) ;; *) echo "gpu_serve_load: bad --step $STEP" >&2; exit 2 ;; esac

OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
W=/tmp/gsl                 # persists between commands on a warm machine
R=$W/results               # every result so far; copied into $OUT by each step
CK=/tmp/m7                 # the HF checkpoint
ENGINE=/tmp/m7.kiln
GGUF=/tmp/m7.gguf
CTX=$((IN + OUTLEN + 64))  # tokens per slot: prompt + output + margin, the same for both servers
mkdir -p "$R"
LOAD="python3 bench/serve_load.py"
LOG=$R/timeline.log        # accumulates over the steps

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for _ in $(seq 50); do
        alive=0
        for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive -eq 0 ] && break
        sleep 0.2
    done
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
    cp -r "$R"/. "$OUT"/ 2>/dev/null
}
trap cleanup EXIT

log() { echo "[$(date +%H:%M:%S) +$((SECONDS))s] $*" | tee -a "$LOG"; }
STEP_END=0
left() { echo $((STEP_END - SECONDS)); }
# lim S: min(S, the time left in this step less 15 s for stopping servers and the summary), at least 1
lim() { local l=$(($(left) - 15)); [ "$1" -lt "$l" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# wait_ready NAME PID PORT SECONDS: /health 200 before the deadline, the process alive
wait_ready() {
    local name=$1 pid=$2 port=$3 until=$((SECONDS + $4))
    while [ $SECONDS -lt $until ]; do
        kill -0 "$pid" 2>/dev/null || { log "$name exited before it was ready"; return 1; }
        if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then
            log "$name ready on port $port"
            return 0
        fi
        sleep 0.5
    done
    log "$name not ready after $4 s"
    return 1
}

# stop PID: SIGTERM, 20 s to drain, then SIGKILL
stop() {
    kill -TERM "$1" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.2; done
    kill -KILL "$1" 2>/dev/null
}

env_log() {
    {
        date -u
        nvidia-smi -L 2>&1
        nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.sm --format=csv 2>&1
        "$KILN" --version 2>&1 | head -3
        "$LLAMA" --version 2>&1 | tail -3
        python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1
        df -h /tmp | tail -1
    } >"$R/env.log" 2>&1
}

# ---- prep: the checkpoint, then kiln compile and the GGUF conversion side by side ----
step_prep() {
    local layers=()
    [ -n "$LAYERS" ] && layers=(--layers "$LAYERS")
    local want="mistral-7b layers=${LAYERS:-32}"
    if [ $FRESH -eq 1 ] || [ "$(cat $W/ckpt.done 2>/dev/null)" != "$want" ]; then
        rm -rf "$CK" "$ENGINE" "$GGUF" $W/ckpt.done $W/engine.done $W/gguf.done
        log "checkpoint: $want"
        timeout "$(lim 200)" python3 bench/make_checkpoint.py --arch mistral-7b "${layers[@]}" --out "$CK" \
            >"$R/make_checkpoint.log" 2>&1 || { log "make_checkpoint failed: $(tail -3 "$R/make_checkpoint.log")"; return 1; }
        cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$CK/" || { log "no tokenizer in $TOK"; return 1; }
        echo "$want" >$W/ckpt.done
        log "checkpoint done: $(tail -1 "$R/make_checkpoint.log")"
    fi
    local kp='' cp_=''
    if [ ! -f $W/engine.done ]; then
        log "kiln compile --target $TARGET"
        ( t0=$SECONDS; timeout "$(lim 300)" "$KILN" compile "$CK" -o "$ENGINE" --target "$TARGET" \
            >"$R/compile.log" 2>&1 && echo ok >$W/engine.done; echo "wall $((SECONDS - t0)) s" >>"$R/compile.log" ) &
        kp=$!
        PIDS+=("$kp")
    fi
    if [ ! -f $W/gguf.done ]; then
        # the converter imports sentencepiece before it looks for tokenizer.model; without the
        # package, the stub lets it fall through to tokenizer.json (scripts/carry_llama_convert.sh)
        local pp=$CONVERT/gguf-py
        python3 -c "import sentencepiece" 2>/dev/null || pp=$pp:$CONVERT/sp-stub
        log "convert_hf_to_gguf --outtype bf16"
        ( t0=$SECONDS; PYTHONPATH=$pp timeout "$(lim 400)" python3 "$CONVERT/convert_hf_to_gguf.py" "$CK" \
            --outtype bf16 --outfile "$GGUF" >"$R/convert.log" 2>&1 && echo ok >$W/gguf.done
          echo "wall $((SECONDS - t0)) s" >>"$R/convert.log" ) &
        cp_=$!
        PIDS+=("$cp_")
    fi
    [ -n "$kp" ] && { wait "$kp"; log "kiln compile: $(tail -2 "$R/compile.log" | tr '\n' ' ')"; }
    [ -n "$cp_" ] && { wait "$cp_"; log "convert: $(tail -2 "$R/convert.log" | tr '\n' ' ')"; }
    ls -la "$CK" "$ENGINE" "$GGUF" >>"$LOG" 2>&1
    [ -f $W/engine.done ] && [ -f $W/gguf.done ]
}

# loads NAME PORT MODEL [EXTRA-BODY]: warm-up, then concurrency 1 and $SLOTS into $R/NAME-c1.json, NAME-c$SLOTS.json
loads() {
    local name=$1 port=$2 model=$3 extra=${4:-"{}"} rc=0
    local common=(--url "http://127.0.0.1:$port" --model "$model" --vocab 32000 --input-len "$IN"
                  --output-len "$OUTLEN" --temperature 0 --timeout 300 --extra-body "$extra")
    log "$name: concurrency 1, $C1_REQ requests (+2 warm-up)"
    timeout "$(lim 240)" $LOAD "${common[@]}" --concurrency 1 --requests "$C1_REQ" --warmup 2 --seed 1 \
        --json "$R/$name-c1.json" >"$R/$name-c1.txt" 2>&1 || rc=1
    tail -4 "$R/$name-c1.txt" | tee -a "$LOG"
    log "$name: concurrency $SLOTS, $C64_REQ requests (+$SLOTS warm-up)"
    timeout "$(lim 400)" $LOAD "${common[@]}" --concurrency "$SLOTS" --requests "$C64_REQ" --warmup "$SLOTS" \
        --seed 2 --json "$R/$name-c$SLOTS.json" >"$R/$name-c$SLOTS.txt" 2>&1 || rc=1
    tail -5 "$R/$name-c$SLOTS.txt" | tee -a "$LOG"
    return $rc
}

# sweep NAME PORT MODEL [EXTRA-BODY] SECONDS: Poisson rates in turn until one misses the SLA
sweep() {
    local name=$1 port=$2 model=$3 extra=$4 secs=$5
    log "$name: SLA sweep, P99 TTFT < $SLA_MS ms, rates $RATES, $SWEEP_REQ requests each"
    timeout "$(lim "$secs")" $LOAD --url "http://127.0.0.1:$port" --model "$model" --vocab 32000 --input-len "$IN" \
        --output-len "$OUTLEN" --temperature 0 --timeout 120 --extra-body "$extra" --warmup 8 --seed 3 \
        --sla-ttft-ms "$SLA_MS" --rates "$RATES" --requests "$SWEEP_REQ" \
        --json "$R/$name-sla.json" >"$R/$name-sla.txt" 2>&1
    tail -4 "$R/$name-sla.txt" | tee -a "$LOG"
}

start_kiln() {
    [ -f "$ENGINE" ] || { log "no engine $ENGINE: run --step prep"; return 1; }
    PORT=$(free_port)
    # --max-batch = llama-server's -np; --max-context = its per-slot context (-c / -np)
    "$KILN" serve "$ENGINE" --device "$DEVICE" --host 127.0.0.1 --port "$PORT" --max-batch "$SLOTS" --max-queue 1024 \
        --max-context "$CTX" --model-name m7 >"$R/kiln-serve.log" 2>&1 &
    SPID=$!
    PIDS+=("$SPID")
    wait_ready "kiln serve" "$SPID" "$PORT" "$(lim 240)"
}

# llama-server's flags (checked against this llama.cpp's common/arg.cpp and tools/server):
#   -ngl 999              every layer on the GPU
#   -fa on                flash attention on (this version takes on|off|auto)
#   -np 64                64 slots, as kiln's --max-batch 64; an explicit -np leaves the KV cache
#                         per slot (kv_unified is only turned on for -np auto)
#   -c 64*(512+128+64)    the total context, split evenly across the slots: 704 tokens each,
#                         enough for a 512-token prompt and 128 new tokens
#   -cb                   continuous batching (the default; explicit for the record)
#   -b 2048 -ub 512       the default logical / physical batch (explicit for the record)
#   --no-cache-prompt     no prompt caching: every request prefills its whole prompt (the prompts
#                         are random, so there would be little to reuse anyway), and the request
#                         body says cache_prompt false too
#   --cache-reuse 0       no KV-shift reuse of cached chunks (the default; explicit)
#   -cram 0               no host-RAM prompt cache (default 8 GiB) saving and restoring idle slots
#   -sps 0                slot choice by LRU, not by similarity to a slot's last prompt
#   --fit off             keep the context and layers as given (fit could lower unset ones)
#   --no-webui            the web UI is not served
#   --alias m7            the model name the requests give
# Optional flags the binary's --help does not know are left out (logged), so a slightly older
# build still starts.
start_llama() {
    [ -f "$GGUF" ] || { log "no GGUF $GGUF: run --step prep"; return 1; }
    PORT=$(free_port)
    local help
    help=$(timeout 30 "$LLAMA" --help 2>&1)
    local flags=(-m "$GGUF" --host 127.0.0.1 --port "$PORT" --alias m7 -ngl 999 -fa on
                 -c $((SLOTS * CTX)) -np "$SLOTS" -cb -b 2048 -ub 512)
    local opt
    for opt in "--no-cache-prompt" "--cache-reuse 0" "-cram 0" "-sps 0" "--fit off" "--no-webui"; do
        if grep -q -- "${opt%% *}" <<<"$help"; then
            # shellcheck disable=SC2206
            flags+=($opt)
        else
            log "llama-server: $opt unknown to this build, left out"
        fi
    done
    echo "${flags[*]}" >"$R/llama-server.flags"
    log "llama-server ${flags[*]}"
    "$LLAMA" "${flags[@]}" >"$R/llama-server.log" 2>&1 &
    SPID=$!
    PIDS+=("$SPID")
    wait_ready "llama-server" "$SPID" "$PORT" "$(lim 240)"
}

step_kiln() {
    start_kiln || { tail -20 "$R/kiln-serve.log"; return 1; }
    loads kiln "$PORT" m7
    local rc=$?
    stop "$SPID"
    log "kiln serve stopped; log tail:"
    tail -5 "$R/kiln-serve.log" | tee -a "$LOG"
    return $rc
}

step_llama() {
    start_llama || { tail -20 "$R/llama-server.log"; return 1; }
    loads llama "$PORT" m7 '{"cache_prompt": false}'
    local rc=$?
    stop "$SPID"
    log "llama-server stopped; log tail:"
    tail -5 "$R/llama-server.log" | tee -a "$LOG"
    return $rc
}

step_sweep() {
    local half=$((($(left) - 60) / 2))
    [ $half -lt 30 ] && half=30
    if start_kiln; then
        sweep kiln "$PORT" m7 "{}" "$half"
        stop "$SPID"
    fi
    if start_llama; then
        sweep llama "$PORT" m7 '{"cache_prompt": false}' "$(($(left) - 30))"
        stop "$SPID"
    fi
}

step_summary() {
    python3 - "$R" "$IN" "$OUTLEN" "$SLOTS" >"$R/summary.md" <<'EOF'
import json, os, sys
R, IN, OUTLEN, SLOTS = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def load(name):
    try:
        d = json.load(open(os.path.join(R, name)))
    except (OSError, ValueError):
        return None
    m = [r for r in d["runs"] if r.get("phase") == "measure"]
    return m[0] if m else None
def f(x, d=1):
    return "-" if x is None else "%.*f" % (d, x)
print("# kiln serve vs llama-server: random-weight Mistral-7B, bf16, one GPU\n")
print("Prompt %s tokens, %s new (ignore_eos, temperature 0), closed loop; times in ms "
      "(bench/serve_load.py, bench/gpu_serve_load.sh).\n" % (IN, OUTLEN))
print("| concurrency | server | ok/failed | output tok/s | TTFT P50 | TTFT P99 | TPOT P50 | TPOT P99 "
      "| TPOT P99/P50 | E2E P50 | E2E P99 |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
runs = {}
for c in (1, SLOTS):
    for name, label in (("kiln", "kiln"), ("llama", "llama-server")):
        r = runs[(c, name)] = load("%s-c%d.json" % (name, c))
        if r is None:
            print("| %d | %s | not run | | | | | | | | |" % (c, label))
            continue
        t, p, e = r["ttft_ms"], r["tpot_ms"], r["e2e_ms"]
        ratio = p["p99"] / p["p50"] if p["p50"] else None
        print("| %d | %s | %d/%d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            c, label, r["ok"], r["failed"], f(r["output_tok_per_s"]), f(t["p50"]), f(t["p99"]),
            f(p["p50"], 2), f(p["p99"], 2), f(ratio, 2), f(e["p50"]), f(e["p99"])))
for c in (1, SLOTS):
    k, l = runs[(c, "kiln")], runs[(c, "llama")]
    if k and l and l["output_tok_per_s"] > 0:
        def ratio(key, q):
            a, b = k[key][q], l[key][q]
            return f(a / b, 2) if a is not None and b else "-"
        print("\nAt concurrency %d, kiln / llama-server: output tok/s %.2f, TTFT P50 %s, TTFT P99 %s, "
              "TPOT P50 %s, TPOT P99 %s, E2E P50 %s (above 1 is better for tok/s, worse for times)." % (
                  c, k["output_tok_per_s"] / l["output_tok_per_s"], ratio("ttft_ms", "p50"),
                  ratio("ttft_ms", "p99"), ratio("tpot_ms", "p50"), ratio("tpot_ms", "p99"),
                  ratio("e2e_ms", "p50")))
for name, label in (("kiln", "kiln"), ("llama", "llama-server")):
    try:
        s = json.load(open(os.path.join(R, name + "-sla.json")))["sla"]
    except (OSError, ValueError, KeyError):
        continue
    print("\n%s, Poisson arrivals, largest rate with P99 TTFT < %g ms: %s req/s (tried: %s)." % (
        label, s["sla_ttft_p99_ms"], s["best_rate"], ", ".join(
            "%g: P99 %s ms%s" % (t["rate"], f(t["ttft_p99_ms"]), "" if t["meets"] else " (miss)")
            for t in s["tried"])))
EOF
    cat "$R/summary.md"
}

run_step() {
    STEP_END=$((SECONDS + BUDGET))
    log "step $1 (budget $BUDGET s)"
    "step_$1"
    local rc=$?
    log "step $1 done, exit $rc"
    return $rc
}

env_log
rc=0
case $STEP in
    all)
        for s in prep kiln llama sweep; do run_step $s || rc=1; done
        ;;
    *) run_step "$STEP" || rc=1 ;;
esac
[ "$STEP" != summary ] && step_summary >/dev/null
[ "$STEP" != summary ] && cat "$R/summary.md"
cp -r "$R"/. "$OUT"/
exit $rc

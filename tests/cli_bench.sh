#!/usr/bin/env bash
# cli_bench.sh — `kiln bench` through the binary on tests/data/tiny-mistral
# (CPU): queued requests over a KV pool that holds 4 at a time complete with
# end-to-end throughput and ordered TTFT/TPOT percentiles; a request the pool
# can never hold is refused (exit 1), not waited for; bad options exit 2.
#
# usage: bash tests/cli_bench.sh KILN_EXE SOURCE_DIR [SHARED_DIR]
set -u
KILN=$1
SRC=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-cli-bench-XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/lib_cli.sh"

"$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/tiny.kiln" --target none >/dev/null 2>&1 || bad "compile tiny-mistral"

# 30 requests, 8 slots, 64 KiB of CPU KV = 128 tokens = 4 requests of 16 + 16 - 1 at a time
if timeout 300 "$KILN" bench "$T/tiny.kiln" --device cpu --threads 1 --batch 8 --requests 30 --input-len 16 \
    --output-len 16 --kv-memory 64K --reps 1 --warmup 0 --json >"$T/out" 2>"$T/err"; then ok; else
    bad "queued bench exited $?: $(cat "$T/err")"; fi
if python3 - "$T/out" <<'PY'; then ok; else bad "queued bench JSON lines (see above)"; fi
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
m = {r["metric"]: r["value"] for r in rows if r["batch"] == 8}
assert all(r["requests"] == (30 if r["batch"] == 8 else 1) for r in rows), rows
assert all(r["device"] == "cpu" and r["gpu"] == "none" and r["gpus"] == "none" for r in rows), rows[0]
assert m["e2e_output_tokens_per_s"] > 0 and m["e2e_total_tokens_per_s"] > m["e2e_output_tokens_per_s"], m
for k in ("ttft", "tpot"):
    assert 0 < m[k + "_p50_ms"] <= m[k + "_p90_ms"] <= m[k + "_p99_ms"], (k, m)
assert m["max_running"] == 4 and m["kv_capacity_tokens"] == 128, m
assert "decode_tokens_per_s" not in m and "prefill_ms" not in m, m  # queued: no full-batch figures
PY
# 31 KV tokens a request, a pool of 16: refused at submit
expect 1 "needs 31 KV tokens.*holds 16" -- timeout 60 "$KILN" bench "$T/tiny.kiln" --device cpu --batch 2 \
    --requests 5 --input-len 16 --output-len 16 --kv-memory 8K --reps 1 --warmup 0
expect 2 "--requests '0'" -- "$KILN" bench "$T/tiny.kiln" --requests 0
expect 2 "below --batch" -- "$KILN" bench "$T/tiny.kiln" --batch 8 --max-step-tokens 4
# measurement knobs and the profile are the GPU's: refused by name on the CPU, checked on any device
expect 1 "measure: 'attn_waves=99' is not a known knob" -- "$KILN" bench "$T/tiny.kiln" --measure attn_waves=99
expect 1 "measure: 'decode_tc_min=0' is not a known knob" -- "$KILN" bench "$T/tiny.kiln" --measure decode_tc_min=0
expect 1 "apply to the GPU executor, not device \"cpu\"" -- "$KILN" bench "$T/tiny.kiln" --device cpu --measure lt_tune=0
expect 1 "measure: 'moe_grouped=2' is not a known knob" -- "$KILN" bench "$T/tiny.kiln" --measure moe_grouped=2
expect 1 "apply to the GPU executor, not device \"cpu\"" -- "$KILN" bench "$T/tiny.kiln" --device cpu --measure moe_grouped=1
expect 1 "measure: 'tp_oneshot=3' is not a known knob" -- "$KILN" bench "$T/tiny.kiln" --measure tp_oneshot=3
expect 1 "apply to the GPU executor, not device \"cpu\"" -- "$KILN" bench "$T/tiny.kiln" --device cpu --measure tp_oneshot=2
expect 1 "measure: 'lt_search=2' is not a known knob" -- "$KILN" bench "$T/tiny.kiln" --measure lt_search=2
expect 1 "apply to the GPU executor, not device \"cpu\"" -- "$KILN" bench "$T/tiny.kiln" --device cpu --measure lt_search=1
expect 1 "measure: 'w8a8_fast=2' is not a known knob" -- "$KILN" bench "$T/tiny.kiln" --measure w8a8_fast=2
expect 2 "do not apply to --device cpu" -- "$KILN" bench "$T/tiny.kiln" --device cpu --profile
expect 2 "--ceilings '4' is not BW,TF" -- "$KILN" bench "$T/tiny.kiln" --profile --ceilings 4
expect 2 "--ceilings goes with --profile" -- "$KILN" bench "$T/tiny.kiln" --ceilings 4,785
# --gpus is checked like the other options (more in cli_tp.sh)
expect 2 '--gpus "0,a": item 2 "a" is not a CUDA device ordinal' -- "$KILN" bench "$T/tiny.kiln" --gpus 0,a
expect 1 'gpus "0" lists GPUs, which do not apply to device "cpu"' -- "$KILN" bench "$T/tiny.kiln" --device cpu --gpus 0
"$KILN" bench --help | grep -q -- "--requests R" && ok || bad "bench --help lacks --requests"
cli_summary

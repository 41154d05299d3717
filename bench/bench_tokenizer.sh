#!/usr/bin/env bash
# bench_tokenizer.sh — encode throughput of kiln's tokenizer beside HuggingFace
# `tokenizers`, single thread, same text, same run, same machine.
#
#   bash bench/bench_tokenizer.sh [SHARED_DIR] [MB]
#
# Builds test_tokenizer (Release, build-bench-tok/) whose hidden `--bench`
# mode is the kiln driver, writes ~MB (default 10) of mixed text with
# bench/bench_tokenizer.py, then for llama2, llama3 and qwen3 encodes it line
# by line (each line with its "\n") with both — HF through
# Tokenizer.encode(line, add_special_tokens=False), never encode_batch, with
# TOKENIZERS_PARALLELISM=false — and prints one JSON line per tokenizer:
#   {tokenizer, bytes, kiln_seconds, kiln_MBps, hf_seconds, hf_MBps, ratio,
#    ids_match, kiln_load_ms, hf_load_ms, blob_bytes}
# ratio = kiln MB/s / HF MB/s; ids_match compares an order-sensitive hash of
# every id both produced. Not a test: numbers go to docs/benchmarks.md.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
SHARED="${1:-$SRC/../shared}"
MB="${2:-10}"
BUILD="$SRC/build-bench-tok"
export TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
if ! { cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_SHARED_DIR="$SHARED" &&
       cmake --build "$BUILD" --target test_tokenizer -j2; } >"$TMP/build.log" 2>&1; then
    cat "$TMP/build.log" >&2
    echo "bench_tokenizer.sh: the Release build of test_tokenizer failed (log above)" >&2
    exit 1
fi
echo "{\"cpu\": \"$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)\", \"python\": \"$(python3 -V 2>&1)\"}" >&2
python3 "$SRC/bench/bench_tokenizer.py" text "$TMP/text.txt" "$MB" >&2

for name in llama2 llama3 qwen3; do
    dir="$SHARED/tokenizers/$name"
    kiln_json="$("$BUILD/test_tokenizer" --bench "$dir" "$TMP/text.txt")"
    hf_json="$(python3 "$SRC/bench/bench_tokenizer.py" hf "$dir" "$TMP/text.txt")"
    python3 - "$name" "$kiln_json" "$hf_json" <<'EOF'
import json, sys
name, k, h = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
mb = k["bytes"] / 1e6
out = {"tokenizer": name, "bytes": k["bytes"],
       "kiln_seconds": k["seconds"], "kiln_MBps": round(mb / k["seconds"], 2),
       "hf_seconds": h["seconds"], "hf_MBps": round(mb / h["seconds"], 2),
       "ratio": round(h["seconds"] / k["seconds"], 2),
       "ids": k["ids"], "ids_match": k["ids"] == h["ids"] and k["ids_hash"] == h["ids_hash"],
       "kiln_load_ms": k["load_ms"], "hf_load_ms": h["load_ms"], "blob_bytes": k["blob_bytes"],
       "hf_version": h["version"]}
print(json.dumps(out))
EOF
done

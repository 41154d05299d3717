#!/usr/bin/env bash
# cli_trust.sh — the compiler refuses or uses every input and checks values
# (issue 10, "never silently wrong"): unused checkpoint tensors, tied
# embeddings shipped with an lm_head, NaN/Inf/overflowing weights, tokenizer
# ids beyond the model's vocabulary, and generation_config.json (its eos ids
# and sampling defaults reach `kiln run`).
#
# usage: bash tests/cli_trust.sh KILN_EXE SOURCE_DIR [SHARED_DIR]
set -u
KILN=$1
SRC=$2
SHARED=${3:-$SRC/../shared}
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-trust-XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/lib_cli.sh"

# st_edit FILE PYTHON: rewrite a safetensors file. The code sees `t`, a dict
# name -> [dtype, shape, bytearray], and helpers add(name, dtype, shape,
# values), setv(name, i, value) and setbits(name, i, bits) (element i).
st_edit() {
    python3 - "$1" "$2" <<'PY'
import json, struct, sys
path, code = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
hdr.pop("__metadata__", None)
t = {k: [v["dtype"], v["shape"], bytearray(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])]
     for k, v in hdr.items()}
size = {"F32": 4, "F16": 2, "BF16": 2}
def enc(dt, x):
    if dt == "F32": return struct.pack("<f", x)
    if dt == "F16": return struct.pack("<e", x)
    return struct.pack("<f", x)[2:]
def setv(name, i, x):
    dt = t[name][0]; s = size[dt]; t[name][2][i * s:(i + 1) * s] = enc(dt, x)
def setbits(name, i, bits):
    dt = t[name][0]; s = size[dt]; t[name][2][i * s:(i + 1) * s] = bits.to_bytes(s, "little")
def add(name, dt, shape, values):
    t[name] = [dt, shape, bytearray(b"".join(enc(dt, v) for v in values))]
exec(code)
out, data = {}, bytearray()
for k in sorted(t):
    out[k] = {"dtype": t[k][0], "shape": t[k][1], "data_offsets": [len(data), len(data) + len(t[k][2])]}
    data += t[k][2]
h = json.dumps(out).encode()
open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
}

ST=model.safetensors
EMB=model.embed_tokens.weight

# ---- 1. every checkpoint tensor is used or refused by name ----
d=$(mkckpt bias); st_edit "$d/$ST" 'add("model.layers.0.self_attn.q_proj.bias", "BF16", [64], [0.0] * 64)'
compile_fails 1 "model.layers.0.self_attn.q_proj.bias.*not used|hint: .*--allow-unused" "$d"
grep -q "^hint: .*--allow-unused" "$T/err" && ok || bad "no --allow-unused hint"
d=$(mkckpt qnorm)
st_edit "$d/$ST" 'add("model.layers.0.self_attn.q_norm.weight", "BF16", [16], [1.0] * 16); add("model.layers.1.self_attn.q_norm.weight", "BF16", [16], [1.0] * 16); add("model.layers.1.self_attn.k_norm.weight", "BF16", [16], [1.0] * 16)'
compile_fails 1 "model.layers.0.self_attn.q_norm.weight.*and 2 other unused tensors" "$d"
# allowed by pattern: compiles, and the engine is the original's byte for byte
"$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/ref.kiln" 2>/dev/null || bad "tiny-mistral does not compile"
expect 0 "" -- "$KILN" compile "$d" -o "$T/allowed.kiln" --allow-unused '*.q_norm.weight' --allow-unused '*.k_norm.weight'
cmp -s "$T/ref.kiln" "$T/allowed.kiln" && ok || bad "--allow-unused changed the engine"
# one pattern of two is not enough
expect 1 "model.layers.1.self_attn.k_norm.weight.*not used" -- \
    "$KILN" compile "$d" -o "$T/x.kiln" --allow-unused '*.q_norm.weight'
no_file "$T/x.kiln"
expect 2 "allow-unused" -- "$KILN" compile "$d" -o "$T/x.kiln" --allow-unused ''
# HF's rotary_emb.inv_freq buffers are allowed by default (transformers skips them too)
d=$(mkckpt invfreq); st_edit "$d/$ST" 'add("model.layers.0.self_attn.rotary_emb.inv_freq", "F32", [8], [1.0] * 8)'
expect 0 "" -- "$KILN" compile "$d" -o "$T/inv.kiln"
cmp -s "$T/ref.kiln" "$T/inv.kiln" && ok || bad "an ignored inv_freq changed the engine"
# sharded: the same rule across shards
d="$T/sharded"; cp -r "$SRC/tests/data/tiny-mistral-sharded" "$d"; chmod -R u+w "$d"
st_edit "$d/model-00003-of-00004.safetensors" 'add("model.layers.1.mlp.gate_proj.bias", "BF16", [128], [0.0] * 128)'
compile_fails 1 "model.layers.1.mlp.gate_proj.bias.*not used" "$d"

# ---- 2. tie_word_embeddings with an lm_head.weight in the checkpoint ----
# identical copy: consumed, the same engine as tying without it
d=$(mkckpt tied_same); edit_json "$d/config.json" 'd["tie_word_embeddings"] = True'
st_edit "$d/$ST" 't["lm_head.weight"] = [t["'$EMB'"][0], t["'$EMB'"][1], bytearray(t["'$EMB'"][2])]'
expect 0 "" -- "$KILN" compile "$d" -o "$T/tied_same.kiln"
d2=$(mkckpt tied_none); edit_json "$d2/config.json" 'd["tie_word_embeddings"] = True'
st_edit "$d2/$ST" 'del t["lm_head.weight"]'
expect 0 "" -- "$KILN" compile "$d2" -o "$T/tied_none.kiln"
cmp -s "$T/tied_same.kiln" "$T/tied_none.kiln" && ok || bad "an identical lm_head copy changed the tied engine"
# differing copy (the shipped tiny-mistral's own lm_head): refused
d=$(mkckpt tied_diff); edit_json "$d/config.json" 'd["tie_word_embeddings"] = True'
compile_fails 1 "tie_word_embeddings.*'lm_head.weight' differs from 'model.embed_tokens.weight'.*element" "$d"
# one element differs
d=$(mkckpt tied_one); edit_json "$d/config.json" 'd["tie_word_embeddings"] = True'
st_edit "$d/$ST" 't["lm_head.weight"] = [t["'$EMB'"][0], t["'$EMB'"][1], bytearray(t["'$EMB'"][2])]; setv("lm_head.weight", 64 * 200 + 3, 7.0)'
compile_fails 1 "differs.*element 12803 = \[200,3\]: 7 vs" "$d"
# a tied lm_head of the wrong shape is refused by shape
d=$(mkckpt tied_shape); edit_json "$d/config.json" 'd["tie_word_embeddings"] = True'
st_edit "$d/$ST" 'add("lm_head.weight", "BF16", [2, 64], [0.0] * 128)'
compile_fails 1 "lm_head.weight.*shape \[2,64\]" "$d"

# ---- 3. weight values checked while converting ----
Q=model.layers.1.self_attn.q_proj.weight   # [64,64] bf16 in tiny-mistral
d=$(mkckpt nan); st_edit "$d/$ST" 'setbits("'$Q'", 64 * 5 + 7, 0x7fc0)'
compile_fails 1 "weight '$Q' \(bf16\): element 327 \[5,7\] is NaN" "$d"
expect 1 "element 327 \[5,7\] is NaN" -- "$KILN" compile "$d" -o "$T/out.kiln" --dtype f32 --compress
no_file "$T/out.kiln"
d=$(mkckpt inf); st_edit "$d/$ST" 'setbits("'$Q'", 0, 0xff80)'
compile_fails 1 "element 0 \[0,0\] is -Inf" "$d"
expect 1 "element 0 \[0,0\] is -Inf" -- "$KILN" compile "$d" -o "$T/out.kiln" --dtype f16
no_file "$T/out.kiln"
# a norm weight (always converted to f32)
d=$(mkckpt norminf); st_edit "$d/$ST" 'setbits("model.norm.weight", 63, 0x7f80)'
compile_fails 1 "weight 'model.norm.weight' \(bf16\): element 63 \[63\] is \+Inf" "$d"
# f32 and f16 checkpoints too
d=$(mkckpt f32nan)
st_edit "$d/$ST" 'import struct; e = t["'$EMB'"]; vals = [struct.unpack("<f", bytes(e[2][i:i + 2]) + b"\0\0")[0] for i in range(0, len(e[2]), 2)]; add("'$EMB'", "F32", e[1], vals); setv("'$EMB'", 1000, float("nan"))'
compile_fails 1 "weight '$EMB' \(f32\): element 1000 \[15,40\] is NaN" "$d"
d=$(mkckpt f16inf)
st_edit "$d/$ST" 'import struct; e = t["'$EMB'"]; vals = [struct.unpack("<f", bytes(e[2][i:i + 2]) + b"\0\0")[0] for i in range(0, len(e[2]), 2)]; add("'$EMB'", "F16", e[1], vals); setbits("'$EMB'", 70, 0x7c00)'
compile_fails 1 "weight '$EMB' \(f16\): element 70 \[1,6\] is \+Inf" "$d"
# f16 overflow: 70000 fits bf16 and f32 but not f16
d=$(mkckpt big); st_edit "$d/$ST" 'setv("'$Q'", 100, 70000.0)'
expect 0 "" -- "$KILN" compile "$d" -o "$T/big.kiln"
expect 0 "" -- "$KILN" compile "$d" -o "$T/big.kiln" --dtype f32
expect 1 "weight '$Q': element 100 \[1,36\] is 69632, beyond the range of f16 \(max 65504\)" -- \
    "$KILN" compile "$d" -o "$T/out.kiln" --dtype f16
no_file "$T/out.kiln"
grep -q "^hint: .*--dtype" "$T/err" && ok || bad "no --dtype hint for an f16 overflow"

cli_summary

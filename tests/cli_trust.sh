#!/usr/bin/env bash
# cli_trust.sh — the compiler refuses or uses every input and checks values
# (issue 10, "never silently wrong"): unused checkpoint tensors, tied
# embeddings shipped with an lm_head, NaN/Inf/overflowing weights, tokenizer
# ids beyond the model's vocabulary, generation_config.json (its eos ids
# and sampling defaults reach `kiln run`), and the expert tensors of Mixtral
# and Qwen3-MoE in both forms (a missing, extra or damaged expert is refused
# by name).
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
# with every tensor used, sharded and single-file checkpoints still give the same bytes
expect 0 "" -- "$KILN" compile "$SRC/tests/data/tiny-mistral-sharded" -o "$T/sharded.kiln"
cmp -s "$T/ref.kiln" "$T/sharded.kiln" && ok || bad "sharded and single-file engines differ"

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
# explicitly allowing the shipped lm_head to stay unused ties, as transformers 4 did
expect 0 "" -- "$KILN" compile "$d" -o "$T/tied_allowed.kiln" --allow-unused lm_head.weight
cmp -s "$T/tied_allowed.kiln" "$T/tied_none.kiln" && ok || bad "--allow-unused lm_head.weight did not tie"
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
# in up_proj, which the engine stores interleaved with gate_proj (pass pack-weights): still named by its own tensor
U=model.layers.0.mlp.up_proj.weight   # [128,64] bf16 in tiny-mistral
d=$(mkckpt upnan); st_edit "$d/$ST" 'setbits("'$U'", 64 * 3 + 5, 0x7fc0)'
compile_fails 1 "weight '$U' \(bf16\): element 197 \[3,5\] is NaN" "$d"
# quantized (--quant int4: rows read as checked floats, packed and quantized): still named by its own tensor
expect 1 "weight '$U' \(bf16\): element 197 \[3,5\] is NaN" -- "$KILN" compile "$d" -o "$T/out.kiln" --quant int4 \
    --target none
no_file "$T/out.kiln"
# --quant fp8 the same: a NaN and an infinity named by their own tensors before any E4M3 rounding
expect 1 "weight '$U' \(bf16\): element 197 \[3,5\] is NaN" -- "$KILN" compile "$d" -o "$T/out.kiln" --quant fp8 \
    --target none
no_file "$T/out.kiln"
d=$(mkckpt fp8inf); st_edit "$d/$ST" 'setbits("'$Q'", 64 * 2 + 1, 0x7f80)'
expect 1 "weight '$Q' \(bf16\): element 129 \[2,1\] is \+Inf" -- "$KILN" compile "$d" -o "$T/out.kiln" --quant fp8 \
    --target none
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

# ---- 4. tokenizer ids cross-checked against the model's vocab_size ----
if [ -d "$SHARED/tokenizers/llama2" ] && [ -d "$SHARED/models/pycode-22m" ]; then
    # a 32000-token tokenizer for a 256-row model
    d=$(mkckpt tok_big); cp "$SHARED/tokenizers/llama2/"*.json "$d/"
    compile_fails 1 "tokenizer.json: token \".*\" has id 256, outside the model's vocabulary: config.json's vocab_size is 256 \(31744 tokenizer ids are outside it, the highest 31999\)" "$d"
    grep -q "^hint: .*not this model's" "$T/err" && ok || bad "no hint for a tokenizer of another model"
    # an added special token past the model's rows, used as eos by tokenizer_config.json
    d="$T/py_added"; cp -r "$SHARED/models/pycode-22m" "$d"; chmod -R u+w "$d"
    edit_json "$d/tokenizer.json" 'd["added_tokens"].append(dict(id=32000, content="<|im_end|>", single_word=False, lstrip=False, rstrip=False, normalized=False, special=True))'
    edit_json "$d/tokenizer_config.json" 'd["eos_token"] = "<|im_end|>"'
    compile_fails 1 "token \"<\|im_end\|>\" \(an eos token\) has id 32000, outside the model's vocabulary: config.json's vocab_size is 32000 \(1 tokenizer ids" "$d"
    # the same tokenizer for a model with more rows than tokens (padded vocab) is fine
    edit_json "$d/tokenizer.json" 'd["added_tokens"].pop()'
    edit_json "$d/tokenizer_config.json" 'd["eos_token"] = "</s>"'
    expect 0 "" -- "$KILN" compile "$d" -o "$T/py.kiln"
    # ... but an eos id in the padding (a row of the model, no token of the tokenizer) is refused
    python3 - "$d" <<'PY'
import json, struct, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json")); c["vocab_size"] = 32064; json.dump(c, open(d + "/config.json", "w"))
g = json.load(open(d + "/generation_config.json")); g["eos_token_id"] = [2, 32010]
json.dump(g, open(d + "/generation_config.json", "w"))
# pad the embedding (shard 1 holds only it) to 32064 rows
p = d + "/model-00001-of-00002.safetensors"; raw = open(p, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n]); e = h["model.embed_tokens.weight"]
row = e["shape"][1] * 2; e["shape"][0] = 32064; e["data_offsets"][1] += 64 * row
hb = json.dumps(h).encode(); open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:] + b"\0" * 64 * row)
PY
    compile_fails 1 "generation_config.json: eos_token_id 32010 is not a token of .*tokenizer.json \(its ids: 0..31999\)" "$d"
    edit_json "$d/generation_config.json" 'd["eos_token_id"] = 2'
    expect 0 "" -- "$KILN" compile "$d" -o "$T/py.kiln"
else
    echo "SKIP: tokenizer checks need $SHARED/tokenizers/llama2 and $SHARED/models/pycode-22m"
fi

# ---- 5. generation_config.json: eos ids and sampling defaults reach `kiln run` ----
# mkstories NAME: a copy of stories260k (a trained model: its greedy output is not a loop of one id)
mkstories() {
    rm -rf "$T/$1"
    cp -r "$SRC/models/stories260k" "$T/$1"
    chmod -R u+w "$T/$1"
    echo "$T/$1"
}
# ids_of FILE: the "ids" of a `kiln run --json` output, comma-separated
ids_of() { python3 -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["ids"])))' "$1"; }
field_of() { python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }
RUN="--device cpu --prompt-ids 1 --max-tokens 24 --json"
ROUND='[round(d["sampling"][k], 6) for k in ("temperature", "top_k", "top_p")]'  # the f32 sampling options

d=$(mkstories s_ref)
"$KILN" compile "$d" -o "$T/s_ref.kiln" 2>/dev/null || bad "stories260k does not compile"
"$KILN" run "$T/s_ref.kiln" $RUN --ignore-eos >"$T/greedy.json" 2>/dev/null || bad "stories260k does not run"
greedy=$(ids_of "$T/greedy.json")
stop=$(echo "$greedy" | cut -d, -f6)   # the 6th greedy token becomes an eos id
# eos only in generation_config.json (config.json has none): generation stops there
d=$(mkstories s_eos)
edit_json "$d/config.json" 'd.pop("eos_token_id", None)'
edit_json "$d/generation_config.json" 'd["eos_token_id"] = [500, '"$stop"']'
expect 0 "" -- "$KILN" compile "$d" -o "$T/s_eos.kiln"
"$KILN" inspect "$T/s_eos.kiln" --json >"$T/meta.json"
[ "$(field_of "$T/meta.json" 'd["generation"]["eos_token_ids"]')" = "[500, $stop]" ] && ok || bad "eos ids not in meta"
[ "$(field_of "$T/meta.json" 'd["generation"]["sources"]["eos_token_ids"]')" = "generation_config.json" ] && ok ||
    bad "eos source not recorded"
"$KILN" run "$T/s_eos.kiln" $RUN >"$T/eos.json" 2>/dev/null || bad "run failed"
want=$(echo "$greedy" | tr , '\n' | awk -v s="$stop" '{print} $0 == s {exit}' | paste -sd,)
[ "$(ids_of "$T/eos.json")" = "$want" ] && ok || bad "generation did not stop at the eos of generation_config.json: $(ids_of "$T/eos.json") vs $want"
[ "$(field_of "$T/eos.json" 'd["stop_reason"]')" = "eos" ] && ok || bad "stop_reason is not eos"
# the file replaces config.json's ids (as generate() does): config.json's eos alone no longer stops
d=$(mkstories s_cfg_eos)
edit_json "$d/config.json" 'd["eos_token_id"] = '"$stop"
edit_json "$d/generation_config.json" 'd["eos_token_id"] = 500'
"$KILN" compile "$d" -o "$T/s_cfg.kiln" 2>/dev/null && "$KILN" run "$T/s_cfg.kiln" $RUN >"$T/cfg.json" 2>/dev/null
[ "$(ids_of "$T/cfg.json")" = "$greedy" ] && ok || bad "config.json's eos was used although generation_config.json has one"

# sampling defaults: applied by `kiln run`, and each option overrides its own
d=$(mkstories s_samp)
edit_json "$d/generation_config.json" 'd.update(do_sample=True, temperature=0.9, top_k=40, top_p=0.95)'
expect 0 "" -- "$KILN" compile "$d" -o "$T/s_samp.kiln"
"$KILN" inspect "$T/s_samp.kiln" --json >"$T/meta.json"
[ "$(field_of "$T/meta.json" '[d["generation"][k] for k in ("do_sample", "temperature", "top_k", "top_p")]')" = \
  "[True, 0.9, 40, 0.95]" ] && ok || bad "sampling defaults not in meta"
[ "$(field_of "$T/meta.json" 'd["format_version"]["minor"]')" -ge 1 ] && ok || bad "engine minor not bumped"
"$KILN" run "$T/s_samp.kiln" $RUN --seed 7 >"$T/samp.json" 2>/dev/null
[ "$(field_of "$T/samp.json" "$ROUND")" = "[0.9, 40, 0.95]" ] && ok ||
    bad "run did not apply the engine's sampling defaults: $(field_of "$T/samp.json" "$ROUND")"
"$KILN" run "$T/s_ref.kiln" $RUN --seed 7 --temperature 0.9 --top-k 40 --top-p 0.95 >"$T/explicit.json" 2>/dev/null
[ "$(ids_of "$T/samp.json")" = "$(ids_of "$T/explicit.json")" ] && ok || bad "defaults differ from the same options given"
[ "$(ids_of "$T/samp.json")" != "$greedy" ] && ok || bad "sampling defaults gave the greedy output"
"$KILN" run "$T/s_samp.kiln" $RUN --temperature 0 >"$T/over.json" 2>/dev/null
[ "$(ids_of "$T/over.json")" = "$greedy" ] && ok || bad "--temperature 0 did not override the engine's default"
"$KILN" run "$T/s_samp.kiln" $RUN --top-k 3 --seed 7 >"$T/over.json" 2>/dev/null
[ "$(field_of "$T/over.json" "$ROUND")" = "[0.9, 3, 0.95]" ] && ok ||
    bad "--top-k did not override only top_k"
# do_sample false: greedy whatever temperature says (as generate())
d=$(mkstories s_nosamp)
edit_json "$d/generation_config.json" 'd.update(do_sample=False, temperature=0.6, top_p=0.9)'
"$KILN" compile "$d" -o "$T/s_nosamp.kiln" 2>/dev/null && "$KILN" run "$T/s_nosamp.kiln" $RUN >"$T/ns.json" 2>/dev/null
[ "$(ids_of "$T/ns.json")" = "$greedy" ] && ok || bad "do_sample false was not greedy"

# malformed generation_config.json: refused by name, never a hang, no engine left
d=$(mkstories g_json); echo '{"eos_token_id": 2,' >"$d/generation_config.json"
compile_fails 1 "generation_config.json: not valid JSON" "$d"
d=$(mkstories g_vocab); edit_json "$d/generation_config.json" 'd["eos_token_id"] = [2, 512]'
compile_fails 1 "generation_config.json: field \"eos_token_id\[1\]\" is 512, outside the model's vocabulary \[0, 512\)" "$d"
d=$(mkstories g_bos); edit_json "$d/generation_config.json" 'd["bos_token_id"] = -3'
compile_fails 1 "\"bos_token_id\" is -3" "$d"
d=$(mkstories g_type); edit_json "$d/generation_config.json" 'd["do_sample"] = "yes"'
compile_fails 1 "\"do_sample\" is \"yes\"; it must be true or false" "$d"
d=$(mkstories g_temp); edit_json "$d/generation_config.json" 'd.update(do_sample=True, temperature=0)'
compile_fails 1 "\"temperature\" is 0 with \"do_sample\": true" "$d"
d=$(mkstories g_topp); edit_json "$d/generation_config.json" 'd["top_p"] = 2'
compile_fails 1 "\"top_p\" is 2" "$d"
d=$(mkstories g_dir); rm "$d/generation_config.json"; mkdir "$d/generation_config.json"
compile_fails 1 "generation_config.json: not a regular file" "$d"
d=$(mkstories g_fifo); rm "$d/generation_config.json"; mkfifo "$d/generation_config.json"
expect 1 "generation_config.json: not a regular file" -- timeout 20 "$KILN" compile "$d" -o "$T/out.kiln"
no_file "$T/out.kiln"
# config.json's own bos/eos outside the vocabulary were refused before; still are
d=$(mkstories c_eos); edit_json "$d/config.json" 'd["eos_token_id"] = 512'
compile_fails 1 "config.json: field \"eos_token_id\" is 512, outside the vocabulary" "$d"

# ---- 6. Mixtral's experts: both checkpoint forms; each expert tensor used or refused by name ----
# mkmix NAME: a copy of the tiny Mixtral checkpoint (published form: block_sparse_moe.experts.E.w1/w2/w3)
mkmix() {
    rm -rf "$T/$1"
    cp -r "$SRC/tests/data/tiny-mixtral" "$T/$1"
    chmod -R u+w "$T/$1"
    echo "$T/$1"
}
MX=model.layers.1.block_sparse_moe
d=$(mkmix mx_missing); st_edit "$d/$ST" 'del t["'$MX'.experts.3.w2.weight"]'
compile_fails 1 "tensor '$MX.experts.3.w2.weight' is missing" "$d"
d=$(mkmix mx_extra); st_edit "$d/$ST" 'add("'$MX'.experts.8.w1.weight", "BF16", [16, 64], [0.0] * 1024)'
compile_fails 1 "tensor '$MX.experts.8.w1.weight' is in the checkpoint but not used by the MixtralForCausalLM graph" "$d"
d=$(mkmix mx_shape); st_edit "$d/$ST" 'add("'$MX'.experts.0.w3.weight", "BF16", [17, 64], [0.0] * 1088)'
compile_fails 1 "tensor '$MX.experts.0.w3.weight' has shape \[17,64\], expected \[16,64\]" "$d"
d=$(mkmix mx_router); st_edit "$d/$ST" 'add("'$MX'.gate.weight", "BF16", [4, 64], [0.0] * 256)'
compile_fails 1 "tensor '$MX.gate.weight' has shape \[4,64\], expected \[8,64\]" "$d"
# a NaN in an expert, stored stacked with the others: named by its own tensor and coordinates
d=$(mkmix mx_nan); st_edit "$d/$ST" 'setbits("'$MX'.experts.5.w3.weight", 64 * 2 + 9, 0x7fc0)'
compile_fails 1 "weight '$MX.experts.5.w3.weight' \(bf16\): element 137 \[2,9\] is NaN" "$d"
# one expert stored in f32 in a bf16 checkpoint: the stack takes the first part's dtype, and its values are
# bf16 ones, so the engine is the original's byte for byte
d=$(mkmix mx_f32part)
st_edit "$d/$ST" 'import struct; e = t["'$MX'.experts.4.w1.weight"]; vals = [struct.unpack("<f", b"\0\0" + bytes(e[2][i:i + 2]))[0] for i in range(0, len(e[2]), 2)]; add("'$MX'.experts.4.w1.weight", "F32", e[1], vals)'
expect 0 "" -- "$KILN" compile "$d" -o "$T/mx_f32part.kiln"
expect 0 "" -- "$KILN" compile "$SRC/tests/data/tiny-mixtral" -o "$T/mx_ref.kiln"
cmp -s "$T/mx_ref.kiln" "$T/mx_f32part.kiln" && ok || bad "an f32 expert in a bf16 checkpoint changed the engine"
# transformers 5's in-memory (fused) form: mlp.gate.weight, mlp.experts.gate_up_proj [E,2F,H] (each
# expert's gate rows, then its up rows), mlp.experts.down_proj [E,H,F]
FUSE='
for l in range(2):
    p = "model.layers.%d." % l
    gu, dn = bytearray(), bytearray()
    for e in range(8):
        q = p + "block_sparse_moe.experts.%d." % e
        gu += t.pop(q + "w1.weight")[2] + t.pop(q + "w3.weight")[2]
        dn += t.pop(q + "w2.weight")[2]
    t[p + "mlp.gate.weight"] = t.pop(p + "block_sparse_moe.gate.weight")
    t[p + "mlp.experts.gate_up_proj"] = ["BF16", [8, 32, 64], gu]
    t[p + "mlp.experts.down_proj"] = ["BF16", [8, 64, 16], dn]
'
d=$(mkmix mx_fused); st_edit "$d/$ST" "$FUSE"
expect 0 "" -- "$KILN" compile "$d" -o "$T/mx_fused.kiln"
expect 0 "" -- "$KILN" compile "$SRC/tests/data/tiny-mixtral" -o "$T/mx.kiln"
# both give HF's greedy ids (golden case 2: 20 prompt ids)
G="$SRC/tests/golden/tiny-mixtral/golden.json"
prompt=$(python3 -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["cases"][2]["prompt"])))' "$G")
want=$(python3 -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["cases"][2]["greedy"][:64])))' "$G")
for e in mx mx_fused; do
    "$KILN" run "$T/$e.kiln" --device cpu --prompt-ids "$prompt" --max-tokens 64 --ignore-eos --temperature 0 \
        --json >"$T/$e.json" 2>"$T/err" || bad "$e.kiln does not run: $(cat "$T/err")"
    [ "$(python3 -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["ids"])))' "$T/$e.json")" = "$want" ] &&
        ok || bad "$e.kiln: greedy ids differ from HF's"
done
# fused, with a tensor missing or one of the other form left over
d=$(mkmix mx_fused_missing); st_edit "$d/$ST" "$FUSE"'
del t["model.layers.0.mlp.experts.down_proj"]'
compile_fails 1 "tensor 'model.layers.0.mlp.experts.down_proj' is missing" "$d"
d=$(mkmix mx_fused_shape); st_edit "$d/$ST" "$FUSE"'
t["model.layers.1.mlp.experts.gate_up_proj"][1] = [8, 64, 32]'
compile_fails 1 "tensor 'model.layers.1.mlp.experts.gate_up_proj' has shape \[8,64,32\], expected \[8,32,64\]" "$d"
d=$(mkmix mx_mixed); st_edit "$d/$ST" 'add("model.layers.0.mlp.experts.down_proj", "BF16", [8, 64, 16], [0.0] * 8192)'
compile_fails 1 "tensor 'model.layers.0.mlp.experts.down_proj' is in the checkpoint but not used" "$d"

# ---- 7. Qwen3-MoE's experts: both checkpoint forms, dense and sparse layers ----
# mkqm NAME: a copy of the tiny Qwen3-MoE checkpoint (published form: mlp.experts.E.{gate,up,down}_proj;
# 16 experts of width 16 in layers 0 and 2, a dense MLP of width 96 in layer 1)
mkqm() {
    rm -rf "$T/$1"
    cp -r "$SRC/tests/data/tiny-qwen3-moe" "$T/$1"
    chmod -R u+w "$T/$1"
    echo "$T/$1"
}
QM=model.layers.2.mlp
d=$(mkqm qm_missing); st_edit "$d/$ST" 'del t["'$QM'.experts.7.down_proj.weight"]'
compile_fails 1 "tensor '$QM.experts.7.down_proj.weight' is missing" "$d"
d=$(mkqm qm_router); st_edit "$d/$ST" 'del t["'$QM'.gate.weight"]'
compile_fails 1 "tensor '$QM.gate.weight' is missing" "$d"
d=$(mkqm qm_extra); st_edit "$d/$ST" 'add("'$QM'.experts.16.gate_proj.weight", "BF16", [16, 64], [0.0] * 1024)'
compile_fails 1 "tensor '$QM.experts.16.gate_proj.weight' is in the checkpoint but not used by the Qwen3MoeForCausalLM graph" "$d"
# the dense layer (mlp_only_layers [1]) has no router or experts, and its MLP is intermediate_size wide
d=$(mkqm qm_dense_router); st_edit "$d/$ST" 'add("model.layers.1.mlp.gate.weight", "BF16", [16, 64], [0.0] * 1024)'
compile_fails 1 "tensor 'model.layers.1.mlp.gate.weight' is in the checkpoint but not used" "$d"
d=$(mkqm qm_dense_shape); st_edit "$d/$ST" 'add("model.layers.1.mlp.up_proj.weight", "BF16", [16, 64], [0.0] * 1024)'
compile_fails 1 "tensor 'model.layers.1.mlp.up_proj.weight' has shape \[16,64\], expected \[96,64\]" "$d"
# an expert of the dense width: experts are moe_intermediate_size wide
d=$(mkqm qm_shape); st_edit "$d/$ST" 'add("'$QM'.experts.0.up_proj.weight", "BF16", [96, 64], [0.0] * 6144)'
compile_fails 1 "tensor '$QM.experts.0.up_proj.weight' has shape \[96,64\], expected \[16,64\]" "$d"
# no q_norm: Qwen3's per-head norms are part of the model
d=$(mkqm qm_qnorm); st_edit "$d/$ST" 'del t["model.layers.0.self_attn.q_norm.weight"]'
compile_fails 1 "tensor 'model.layers.0.self_attn.q_norm.weight' is missing" "$d"
# mlp_only_layers changed to [] in config.json: layer 1's dense MLP is unused, its experts missing
d=$(mkqm qm_all_sparse); edit_json "$d/config.json" 'd["mlp_only_layers"] = []'
compile_fails 1 "tensor 'model.layers.1.mlp.gate.weight' is missing" "$d"
# transformers 5's in-memory (fused) form, as Mixtral's: mlp.experts.gate_up_proj [E,2F,H] (each expert's
# gate rows, then its up rows), mlp.experts.down_proj [E,H,F]; the router keeps its name
QFUSE='
for l in (0, 2):
    p = "model.layers.%d.mlp." % l
    gu, dn = bytearray(), bytearray()
    for e in range(16):
        q = p + "experts.%d." % e
        gu += t.pop(q + "gate_proj.weight")[2] + t.pop(q + "up_proj.weight")[2]
        dn += t.pop(q + "down_proj.weight")[2]
    t[p + "experts.gate_up_proj"] = ["BF16", [16, 32, 64], gu]
    t[p + "experts.down_proj"] = ["BF16", [16, 64, 16], dn]
'
d=$(mkqm qm_fused); st_edit "$d/$ST" "$QFUSE"
expect 0 "" -- "$KILN" compile "$d" -o "$T/qm_fused.kiln"
expect 0 "" -- "$KILN" compile "$SRC/tests/data/tiny-qwen3-moe" -o "$T/qm.kiln"
cmp -s "$T/qm.kiln" "$T/qm_fused.kiln" && bad "the fused form's engine equals the published one's byte for byte (names differ)" || ok
# both give HF's greedy ids (golden case 1: 8 prompt ids)
G="$SRC/tests/golden/tiny-qwen3-moe/golden.json"
prompt=$(python3 -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["cases"][1]["prompt"])))' "$G")
want=$(python3 -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["cases"][1]["greedy"][:64])))' "$G")
for e in qm qm_fused; do
    "$KILN" run "$T/$e.kiln" --device cpu --prompt-ids "$prompt" --max-tokens 64 --ignore-eos --temperature 0 \
        --json >"$T/$e.json" 2>"$T/err" || bad "$e.kiln does not run: $(cat "$T/err")"
    [ "$(python3 -c 'import json, sys; print(",".join(map(str, json.load(open(sys.argv[1]))["ids"])))' "$T/$e.json")" = "$want" ] &&
        ok || bad "$e.kiln: greedy ids differ from HF's"
done
# fused, with a tensor missing, or one of the published form left over
d=$(mkqm qm_fused_missing); st_edit "$d/$ST" "$QFUSE"'
del t["model.layers.0.mlp.experts.down_proj"]'
compile_fails 1 "tensor 'model.layers.0.mlp.experts.down_proj' is missing" "$d"
d=$(mkqm qm_fused_shape); st_edit "$d/$ST" "$QFUSE"'
t["model.layers.2.mlp.experts.down_proj"][1] = [16, 16, 64]'
compile_fails 1 "tensor 'model.layers.2.mlp.experts.down_proj' has shape \[16,16,64\], expected \[16,64,16\]" "$d"
d=$(mkqm qm_mixed); st_edit "$d/$ST" 'add("model.layers.0.mlp.experts.down_proj", "BF16", [16, 64, 16], [0.0] * 16384)'
compile_fails 1 "tensor 'model.layers.0.mlp.experts.down_proj' is in the checkpoint but not used" "$d"
d=$(mkqm qm_mixed2); st_edit "$d/$ST" 'add("model.layers.0.mlp.experts.gate_up_proj", "BF16", [16, 32, 64], [0.0] * 32768)
add("model.layers.0.mlp.experts.down_proj", "BF16", [16, 64, 16], [0.0] * 16384)'
compile_fails 1 "tensor 'model.layers.0.mlp.experts.0.down_proj.weight' is in the checkpoint but not used" "$d"
# norm_topk_prob false: the moe ops say so in the IR and inspect says so
d=$(mkqm qm_nonorm); edit_json "$d/config.json" 'd["norm_topk_prob"] = False'
"$KILN" compile "$d" -o "$T/qm_nonorm.kiln" --dump-ir >"$T/ir" 2>"$T/err" || bad "norm_topk_prob false does not compile: $(cat "$T/err")"
[ "$(grep -c 'moe.*+no_renorm' "$T/ir")" -ge 2 ] && ok || bad "--dump-ir shows no +no_renorm moe"
"$KILN" inspect "$T/qm_nonorm.kiln" | grep -q "16 experts (top 4, weights not renormalised, ffn 16 each, dense MLP on 1 of 3 layers)" &&
    ok || bad "inspect: $("$KILN" inspect "$T/qm_nonorm.kiln" | grep experts)"
"$KILN" inspect "$T/qm.kiln" | grep -q "16 experts (top 4, ffn 16 each, dense MLP on 1 of 3 layers)" && ok || bad "inspect of tiny-qwen3-moe"

# ---- GPTQ's dynamic map (tests/data/tiny-mistral-gptq-dynamic; test_golden checks its numbers) ----
mkgd() {
    rm -rf "$T/$1"
    cp -r "$SRC/tests/data/tiny-mistral-gptq-dynamic" "$T/$1"
    chmod -R u+w "$T/$1"
    echo "$T/$1"
}
expect 0 "" -- "$KILN" compile "$SRC/tests/data/tiny-mistral-gptq-dynamic" -o "$T/gd.kiln" --target none
"$KILN" inspect "$T/gd.kiln" --json | grep -qF '"-:model\\.layers\\.0\\.self_attn\\.(q|k|v|o)_proj": "not quantized"' &&
    ok || bad "inspect --json does not show the dynamic rule's effect"
# each matrix's format: by layer in the text (the formats mix), every one in --json
"$KILN" inspect "$T/gd.kiln" >"$T/gd.txt" 2>&1
grep -q "^formats by layer:" "$T/gd.txt" && grep -q "^  layer 0: o_proj bf16, down_proj q4g32, qkv_proj bf16, gate_up_proj q4g32$" "$T/gd.txt" &&
    grep -q "^  layer 1: o_proj q4g32, down_proj q4g64, qkv_proj q4g32, gate_up_proj q4g64$" "$T/gd.txt" && ok ||
    bad "inspect's formats by layer: $(cat "$T/gd.txt")"
[ "$("$KILN" inspect "$T/gd.kiln" --json | python3 -c 'import json, sys; print(sorted(m["dtype"] for m in json.load(sys.stdin)["plan"]["matrices"]))')" = \
  "['bf16', 'bf16', 'bf16', 'bf16', 'q4g32', 'q4g32', 'q4g32', 'q4g32', 'q4g64', 'q4g64']" ] && ok ||
    bad "inspect --json plan.matrices"
"$KILN" inspect "$T/ref.kiln" | grep -q "^formats by layer" && bad "one format shown by layer" || ok
# a rule that leaves layer 1's q_proj unquantized, which the checkpoint ships dense, while k_proj and v_proj
# stay in groups of 32: they are packed together, so refused naming both
d=$(mkgd gd_mixed)
L1Q=model.layers.1.self_attn.q_proj
st_edit "$d/$ST" 'for s in ("qweight", "qzeros", "scales", "g_idx"): del t["'$L1Q'." + s]
add("'$L1Q'.weight", "BF16", [64, 64], [0.01] * 4096)'
edit_json "$d/config.json" 'q = d["quantization_config"]; q["dynamic"] = dict([("-:model\\.layers\\.1\\.self_attn\\.q_proj", {})] + list(q["dynamic"].items()))'
compile_fails 1 "'$L1Q' is bf16 but 'model.layers.1.self_attn.k_proj' is q4g32: projections that read the same input share one format" "$d"
# a "-:" rule over a module the checkpoint quantized: its dense weight is missing, and its packed tensors unused
d=$(mkgd gd_nodense)
edit_json "$d/config.json" 'q = d["quantization_config"]; q["dynamic"] = dict([("-:model\\.layers\\.1\\.self_attn\\.o_proj", {})] + list(q["dynamic"].items()))'
compile_fails 1 "projection 'model.layers.1.self_attn.o_proj' is left unquantized by quantization_config.dynamic rule .* no 'model.layers.1.self_attn.o_proj.weight'" "$d"
# a group size the stored tensors do not have: refused by the tensors' shapes
d=$(mkgd gd_group)
edit_json "$d/config.json" 'q = d["quantization_config"]; q["dynamic"] = dict([("model\\.layers\\.1\\.self_attn", {"group_size": 64})] + list(q["dynamic"].items()))'
compile_fails 1 "model.layers.1.self_attn.q_proj.(qzeros|scales).*shape" "$d"
grep -q "hint: quantization_config.dynamic rule .* gives 'model.layers.1.self_attn.q_proj' groups of 64" "$T/err" && ok ||
    bad "no hint naming the dynamic rule: $(cat "$T/err")"
# 8 bits for a module: refused naming the rule and the module
d=$(mkgd gd_bits)
edit_json "$d/config.json" 'q = d["quantization_config"]; q["dynamic"] = dict([("+:.*\\.1\\.mlp\\.down_proj", {"bits": 8})] + list(q["dynamic"].items()))'
compile_fails 1 "rule \"\+:\.\*.*down_proj\" gives module 'model.layers.1.mlp.down_proj' 8 bits: kiln reads 4-bit GPTQ only" "$d"

# ---- 4. logits that are not finite give no token (sampler rule 0) ----
# finite weights whose product overflows fp32: the final norm's weights near bf16's largest value and a
# large LM head make every logit +inf or NaN; `kiln run` and `kiln perplexity` then fail naming why
# instead of printing tokens drawn from them
d=$(mkckpt overflow)
st_edit "$d/$ST" 'import struct
for i in range(64): setv("model.norm.weight", i, 3.0e38)
for i in range(256 * 64): setv("lm_head.weight", i, 1000.0 if i % 3 else -1000.0)'
expect 0 "" -- "$KILN" compile "$d" -o "$T/overflow.kiln"
expect 1 "logits for position 3 are not finite.*no token was sampled" -- \
    "$KILN" run "$T/overflow.kiln" --device cpu --prompt-ids 1,5,9 --max-tokens 4 --json
grep -q '"ids"' "$T/out" && bad "kiln run printed ids from non-finite logits" || ok
echo "[1, 5, 9, 13, 17, 21, 25, 29]" >"$T/ov_ids.json"
expect 1 "not finite" -- "$KILN" perplexity "$T/overflow.kiln" --ids-file "$T/ov_ids.json" --device cpu

cli_summary

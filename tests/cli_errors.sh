#!/usr/bin/env bash
# cli_errors.sh — bad input through the `kiln` binary: every case must exit
# non-zero (1 = failure, 2 = usage), print an error on stderr that names what
# is wrong, never crash (no exit by signal), and leave no output file behind.
#
# usage: bash tests/cli_errors.sh KILN_EXE SOURCE_DIR [SHARED_DIR]
set -u
KILN=$1
SRC=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-cli-XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/lib_cli.sh"

# ---- usage errors: exit 2 ----
expect 2 "unknown command" -- "$KILN" frobnicate
expect 2 "missing -o" -- "$KILN" compile "$SRC/models/stories260k"
expect 2 "checkpoint directory" -- "$KILN" compile -o "$T/x.kiln"
expect 2 "unknown weight dtype" -- "$KILN" compile "$SRC/models/stories260k" -o "$T/x.kiln" --dtype int3
expect 2 "unknown or incomplete option" -- "$KILN" compile "$SRC/models/stories260k" -o "$T/x.kiln" --frob
no_file "$T/x.kiln"

# ---- checkpoint directory ----
compile_fails 1 "does-not-exist" "$T/does-not-exist"
d=$(mkckpt noconfig); rm "$d/config.json"
compile_fails 1 "config.json" "$d"
d=$(mkckpt notjson); echo "{ this is not json" >"$d/config.json"
compile_fails 1 "config.json.*(line|JSON)" "$d"
d=$(mkckpt nofield); edit_json "$d/config.json" 'del d["hidden_size"]'
compile_fails 1 "hidden_size" "$d"
d=$(mkckpt wrongtype); edit_json "$d/config.json" 'd["num_hidden_layers"] = "two"'
compile_fails 1 "num_hidden_layers" "$d"
d=$(mkckpt badheads); edit_json "$d/config.json" 'd["num_key_value_heads"] = 3'
compile_fails 1 "num_key_value_heads" "$d"
d=$(mkckpt arch); edit_json "$d/config.json" 'd["architectures"] = ["GPT2LMHeadModel"]'
compile_fails 1 "GPT2LMHeadModel" "$d"
d=$(mkckpt noweights); rm "$d/model.safetensors"
compile_fails 1 "safetensors" "$d"

# ---- safetensors ----
d=$(mkckpt st-short); printf 'abc' >"$d/model.safetensors"
compile_fails 1 "model.safetensors" "$d"
d=$(mkckpt st-trunc); head -c 100 "$SRC/tests/data/tiny-mistral/model.safetensors" >"$d/model.safetensors"
compile_fails 1 "model.safetensors" "$d"
d=$(mkckpt st-hugelen); python3 -c "import struct,sys; open(sys.argv[1],'wb').write(struct.pack('<Q', 1<<40) + b'{}')" "$d/model.safetensors"
compile_fails 1 "header" "$d"
d=$(mkckpt st-overlap); st_write "$d" '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}' 12
compile_fails 1 "overlap|'b'|'a'" "$d"
d=$(mkckpt st-range); st_write "$d" '{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}' 8
compile_fails 1 "'a'|\"a\"" "$d"
d=$(mkckpt st-dtype); st_write "$d" '{"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}}' 8
compile_fails 1 "Q7" "$d"
d=$(mkckpt st-u64); st_write "$d" '{"a":{"dtype":"U64","shape":[1],"data_offsets":[0,8]}}' 8
compile_fails 1 "U64" "$d"
d=$(mkckpt st-shape); st_write "$d" '{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}' 8
compile_fails 1 "'a'|\"a\"" "$d"
d=$(mkckpt st-dup); st_write "$d" '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}' 16
compile_fails 1 "duplicate|'a'|\"a\"" "$d"

# ---- tensors against the config ----
d=$(mkckpt missing-tensor)
python3 - "$d/model.safetensors" <<'EOF'
# drop one tensor, keeping the file valid
import json, struct, sys
p = sys.argv[1]; b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); data = b[8 + n:]
drop = "model.layers.1.mlp.up_proj.weight"; del h[drop]
out, off = {}, 0; blobs = []
for k, v in sorted(((k, v) for k, v in h.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0]):
    s, e = v["data_offsets"]; blobs.append(data[s:e]); out[k] = dict(v, data_offsets=[off, off + e - s]); off += e - s
hb = json.dumps(out).encode(); open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))
EOF
compile_fails 1 "model.layers.1.mlp.up_proj.weight" "$d"
d=$(mkckpt wrong-shape); edit_json "$d/config.json" 'd["intermediate_size"] = 130'
compile_fails 1 "gate_proj.weight.*shape|shape.*gate_proj" "$d"

# ---- sharded index ----
d="$T/shard-missing"; rm -rf "$d"; cp -r "$SRC/tests/data/tiny-mistral-sharded" "$d"; chmod -R u+w "$d"
rm "$d/model-00002-of-00004.safetensors"
compile_fails 1 "model-00002-of-00004.safetensors" "$d"

# ---- engine files ----
"$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/good.kiln" 2>/dev/null
size=$(stat -c %s "$T/good.kiln")
head -c $((size / 2)) "$T/good.kiln" >"$T/trunc.kiln"
expect 1 "trunc" -- "$KILN" inspect "$T/trunc.kiln"
expect 1 "trunc" -- "$KILN" run "$T/trunc.kiln" --prompt-ids 1,2
cp "$T/good.kiln" "$T/flip.kiln"
printf '\xff' | dd of="$T/flip.kiln" bs=1 seek=$((size / 3)) conv=notrunc 2>/dev/null
expect 1 "checksum|corrupt" -- "$KILN" inspect "$T/flip.kiln"
cp "$T/good.kiln" "$T/magic.kiln"; printf 'NOTKILN!' | dd of="$T/magic.kiln" bs=1 conv=notrunc 2>/dev/null
expect 1 "not a kiln engine" -- "$KILN" inspect "$T/magic.kiln"
expect 1 "not a kiln engine" -- "$KILN" run "$SRC/tests/data/tiny-mistral/model.safetensors" --prompt-ids 1
cp "$T/good.kiln" "$T/major.kiln"; printf '\x03\x00' | dd of="$T/major.kiln" bs=1 seek=8 conv=notrunc 2>/dev/null
expect 1 "newer|version" -- "$KILN" inspect "$T/major.kiln"
expect 1 "nope.kiln" -- "$KILN" inspect "$T/nope.kiln"

# ---- run ----
long=$(python3 -c "print(','.join(['5'] * 300))")
expect 1 "300 tokens.*context holds 256" -- "$KILN" run "$T/good.kiln" --prompt-ids "$long" --device cpu
expect 1 "outside the vocabulary" -- "$KILN" run "$T/good.kiln" --prompt-ids 1,9999 --device cpu
expect 2 "prompt-ids" -- "$KILN" run "$T/good.kiln" --prompt-ids 1,,2
expect 2 "temperature" -- "$KILN" run "$T/good.kiln" --prompt-ids 1 --temperature -1
expect 2 "top-p" -- "$KILN" run "$T/good.kiln" --prompt-ids 1 --top-p 1.5
expect 1 "no tokenizer" -- "$KILN" run "$T/good.kiln" --prompt "hello" --device cpu
expect 2 "unknown device" -- "$KILN" run "$T/good.kiln" --prompt-ids 1 --device tpu
expect 2 "gpu-memory" -- "$KILN" run "$T/good.kiln" --prompt-ids 1 --gpu-memory 12Q
expect 2 "gpu-memory" -- "$KILN" run "$T/good.kiln" --prompt-ids 1 --gpu-memory 0
# a failing run with --json still prints a JSON error object on stdout
"$KILN" run "$T/trunc.kiln" --prompt-ids 1 --json >"$T/out" 2>/dev/null
if python3 -c "import json,sys; e=json.load(open(sys.argv[1]))['error']; assert e['code']==8 and 'trunc' in e['message']" "$T/out"; then
    pass=$((pass + 1))
else
    echo "FAIL: --json error object" >&2; fail=$((fail + 1))
fi

# --quant: usage errors, and quantized engines are CPU-only
expect 2 "--quant 'int3': expected int8, fp8, int4 or auto" -- "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/q.kiln" --quant int3
expect 2 "--group-size '48': expected 32, 64 or 128" -- \
    "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/q.kiln" --quant int4 --group-size 48
expect 2 "--group-size applies to int4" -- "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/q.kiln" --quant int8 \
    --group-size 64
# 128, the default, given with a format it does not apply to is refused too (not silently ignored)
expect 2 "--group-size applies to int4" -- "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/q.kiln" --quant int8 \
    --group-size 128
# --quant fp8 --group-size 128: fp8g128 (a scale per row and 128 columns); other groups refused
expect 2 "--group-size 64 with --quant fp8: fp8 takes groups of 128 columns" -- \
    "$KILN" compile "$SRC/tests/data/tiny-llama3" -o "$T/q.kiln" --quant fp8 --group-size 64
expect 0 "wrote" -- "$KILN" compile "$SRC/tests/data/tiny-llama3" -o "$T/f8g.kiln" --quant fp8 --group-size 128 --target none
"$KILN" inspect "$T/f8g.kiln" | grep -q "quantization: fp8g128 (projections)" && ok || bad "--quant fp8 --group-size 128 did not give fp8g128"
expect 0 "stop: max_tokens" -- "$KILN" run "$T/f8g.kiln" --prompt-ids 1,5,9 --max-tokens 4 --device cpu
expect 2 "--quant-head applies with --quant" -- "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/q.kiln" \
    --quant-head int8
expect 2 "--quant-method 'gptq': expected rtn or mse" -- "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/q.kiln" \
    --quant int4 --quant-method gptq
expect 2 "--quant-embedding applies with --quant" -- "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/q.kiln" \
    --quant-embedding int8
expect 2 "--quant-embedding 'int2': expected int8, fp8, int4 or keep" -- "$KILN" compile "$SRC/tests/data/tiny-mistral" \
    -o "$T/q.kiln" --quant int8 --quant-embedding int2
expect 2 "--quant-method applies with --quant" -- "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/q.kiln" \
    --quant-method mse
expect 2 "--quant auto with --tp 2: not supported yet" -- "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/q.kiln" \
    --quant auto --max-weight-bytes 1M --tp 2
no_file "$T/q.kiln"
# --quant with --tp: each rank's shard quantized as its own matrix (test_tp checks the logits against tp 1)
expect 0 "wrote" -- "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/qtp.kiln" --target none --quant int8 --tp 2
"$KILN" run "$T/qtp.kiln" --prompt-ids 1,2,3 --max-tokens 4 --device cpu >/dev/null 2>"$T/err" && ok ||
    bad "a tensor-parallel int8 engine on the CPU: $(cat "$T/err")"
expect 0 "wrote" -- "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/q.kiln" --quant int4 --group-size 32 \
    --target none
"$KILN" inspect "$T/q.kiln" | grep -Eq "^weights: .*bits per weight\), dtype .*q4g32.*q8|q8.*q4g32" && ok ||
    bad "inspect does not show the quantized dtypes: $("$KILN" inspect "$T/q.kiln" | sed -n 3p)"
# --quant fp8 (with the head and embedding fp8 too): inspect names the format and the bits
expect 0 "wrote" -- "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/q8f.kiln" --quant fp8 --quant-head fp8 \
    --quant-embedding fp8 --target none
"$KILN" inspect "$T/q8f.kiln" | grep -Eq "^quantization: fp8 \(projections\), fp8 \(LM head\), fp8 \(embedding\), 10 matrices" &&
    ok || bad "inspect of an fp8 engine: $("$KILN" inspect "$T/q8f.kiln" | grep quantization)"
echo "1 50 60 70 80 90" >"$T/q.ids"
"$KILN" perplexity "$T/q.kiln" --ids-file "$T/q.ids" --device cpu --json 2>"$T/err" | grep -q '"perplexity"' && ok ||
    bad "perplexity of a quantized engine: $(cat "$T/err")"
expect 1 "GPU|gpu" -- "$KILN" run "$T/q.kiln" --prompt-ids 1,2 --max-tokens 2 --device gpu
# the executor table (runtime/api.c): "auto" passes over the GPU for an engine without kernels
"$KILN" run "$T/q.kiln" --prompt-ids 1,2 --max-tokens 2 --device auto 2>&1 | grep -q " on cpu" && ok ||
    bad "--device auto did not take the CPU for an engine without GPU kernels"

# an 8-bit KV cache (--kv-dtype): its scales calibrated (tiny-mistral has no tokenizer for the built-in text:
# ids), shown by inspect, run on the CPU; bad values and a calibration too short refused
KV="$SRC/tests/data/tiny-mistral"
expect 2 "--kv-dtype 'fp16': expected bf16, fp8 or int8" -- "$KILN" compile "$KV" -o "$T/kv.kiln" --kv-dtype fp16
expect 1 "no tokenizer.json.*built-in calibration text" -- "$KILN" compile "$KV" -o "$T/kv.kiln" --target none --kv-dtype fp8
expect 1 "calibration has 6 tokens; at least 32" -- "$KILN" compile "$KV" -o "$T/kv.kiln" --target none --kv-dtype fp8 \
    --calib-ids "$T/q.ids"
no_file "$T/kv.kiln"
for i in $(seq 1 64); do printf '%d ' $((i * 37 % 250)); done >"$T/kv.ids"
expect 0 "wrote" -- "$KILN" compile "$KV" -o "$T/kv.kiln" --target none --kv-dtype int8 --calib-ids "$T/kv.ids"
"$KILN" inspect "$T/kv.kiln" | grep -Eq "^kv cache: int8 codes, scales per kv head of each layer.*file of token ids, 64 tokens" &&
    ok || bad "inspect of an int8 KV engine: $("$KILN" inspect "$T/kv.kiln" | grep 'kv cache')"
"$KILN" run "$T/kv.kiln" --prompt-ids 1,2,3 --max-tokens 4 --device cpu >/dev/null 2>"$T/err" && ok ||
    bad "an int8 KV engine on the CPU: $(cat "$T/err")"
# with --tp 2: each rank's kv head in 8 bits (test_tp checks the logits against tp 1)
expect 0 "wrote" -- "$KILN" compile "$KV" -o "$T/kv2.kiln" --target none --kv-dtype fp8 --calib-ids "$T/kv.ids" --tp 2
"$KILN" run "$T/kv2.kiln" --prompt-ids 1,2,3 --max-tokens 4 --device cpu >/dev/null 2>"$T/err" && ok ||
    bad "a tensor-parallel fp8 KV engine on the CPU: $(cat "$T/err")"

# published quantized checkpoints (AWQ gemm, GPTQ, compressed-tensors pack-quantized): read as they are; what kiln does not read is refused by name
QA="$SRC/tests/data/tiny-mistral-awq"
expect 0 "wrote" -- "$KILN" compile "$QA" -o "$T/qa.kiln" --target none
"$KILN" inspect "$T/qa.kiln" | grep -Eq "^quantization: q4g32 \(projections\), keep \(LM head\).*checkpoint \(awq\)" &&
    ok || bad "inspect does not say the weights came from an AWQ checkpoint: $("$KILN" inspect "$T/qa.kiln" | sed -n 4p)"
expect 0 "wrote" -- "$KILN" compile "$QA" -o "$T/qa.kiln" --target none --quant-head int8 --force
expect 2 "already quantized.*quant_method \"awq\".*without --quant" -- "$KILN" compile "$QA" -o "$T/qq.kiln" --quant int4
expect 2 "already quantized" -- "$KILN" compile "$SRC/tests/data/tiny-mistral-gptq" -o "$T/qq.kiln" --quant int8
no_file "$T/qq.kiln"
# mkqckpt NAME FROM: a copy of the quantized checkpoint tests/data/FROM to break
mkqckpt() {
    rm -rf "$T/$1"
    cp -r "$SRC/tests/data/$2" "$T/$1"
    chmod -R u+w "$T/$1"
    echo "$T/$1"
}
# st_rewrite FILE PYTHON: rewrite a safetensors file, the code editing t = {name: [dtype, shape, bytearray]}
st_rewrite() {
    python3 - "$1" "$2" <<'EOF'
import json, struct, sys
path, expr = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
meta = hdr.pop("__metadata__", None)
t = {k: [v["dtype"], v["shape"], bytearray(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])]
     for k, v in hdr.items()}
exec(expr)
out, data = {}, bytearray()
for k in sorted(t):
    out[k] = {"dtype": t[k][0], "shape": t[k][1], "data_offsets": [len(data), len(data) + len(t[k][2])]}
    data += t[k][2]
if meta is not None:
    out["__metadata__"] = meta
h = json.dumps(out).encode()
open(path, "wb").write(struct.pack("<Q", len(h)) + h + bytes(data))
EOF
}
d=$(mkqckpt q-method tiny-mistral-awq); edit_json "$d/config.json" 'd["quantization_config"]["quant_method"] = "bitsandbytes"'
compile_fails 1 'quantization_config.quant_method" is "bitsandbytes": kiln reads only "awq", "gptq", "compressed-tensors" and "fp8"' "$d"
d=$(mkqckpt q-gemv tiny-mistral-awq); edit_json "$d/config.json" 'd["quantization_config"]["version"] = "gemv"'
compile_fails 1 'quantization_config.version" is "gemv"' "$d"
d=$(mkqckpt q-nozero tiny-mistral-awq); edit_json "$d/config.json" 'd["quantization_config"]["zero_point"] = False'
compile_fails 1 'quantization_config.zero_point" is false' "$d"
d=$(mkqckpt q-bits tiny-mistral-gptq); edit_json "$d/config.json" 'd["quantization_config"]["bits"] = 8'
compile_fails 1 'quantization_config.bits" is 8: kiln reads 4-bit' "$d"
d=$(mkqckpt q-perchannel tiny-mistral-gptq); edit_json "$d/config.json" 'd["quantization_config"]["group_size"] = -1'
compile_fails 1 'quantization_config.group_size" is -1: per-channel' "$d"
d=$(mkqckpt q-dynamic tiny-mistral-gptq)
edit_json "$d/config.json" 'd["quantization_config"]["dynamic"] = {"-:.*down_proj": {}}'
compile_fails 1 "projection 'model.layers.0.mlp.down_proj' is left unquantized by quantization_config.dynamic rule \"-:.\\*down_proj\", but the checkpoint has no 'model.layers.0.mlp.down_proj.weight'" "$d"
d=$(mkqckpt q-marlin tiny-mistral-gptq); edit_json "$d/config.json" 'd["quantization_config"]["checkpoint_format"] = "marlin"'
compile_fails 1 'quantization_config.checkpoint_format" is "marlin"' "$d"
# act-order: a g_idx that permutes the groups (columns 0 and 32 of up_proj swapped) is read (test_golden:
# tiny-mistral-gptq-actorder), but gate_proj, which reads the same input, keeps its groups in order
d=$(mkqckpt q-actorder tiny-mistral-gptq-asym)
st_rewrite "$d/model.safetensors" 'g = t["model.layers.1.mlp.up_proj.g_idx"][2]; g[0:4], g[128:132] = g[128:132], g[0:4]'
compile_fails 1 "'model.layers.1.mlp.gate_proj' and 'model.layers.1.mlp.up_proj' read the same input but their act-order g_idx order its columns in different ways" "$d"
# a g_idx naming a group past the last, or putting more than group_size columns in one
d=$(mkqckpt q-gidx-range tiny-mistral-gptq-asym)
st_rewrite "$d/model.safetensors" 'g = t["model.layers.1.mlp.up_proj.g_idx"][2]; g[20:24] = bytes([99, 0, 0, 0])'
compile_fails 1 "tensor 'model.layers.1.mlp.up_proj.g_idx' maps input column 5 to group 99: there are groups 0 to 1 only" "$d"
d=$(mkqckpt q-gidx-count tiny-mistral-gptq-asym)
st_rewrite "$d/model.safetensors" 'g = t["model.layers.0.self_attn.k_proj.g_idx"][2]; g[160:164] = bytes(4)'
compile_fails 1 "tensor 'model.layers.0.self_attn.k_proj.g_idx' maps input column 40 to group 0, which already has its 32 columns" "$d"
# a qweight one row short (the header and data agree, the shape does not fit config.json)
d=$(mkqckpt q-short tiny-mistral-gptq)
st_rewrite "$d/model.safetensors" 'w = t["model.layers.0.mlp.down_proj.qweight"]; w[1][0] -= 1; del w[2][-4 * w[1][1]:]'
compile_fails 1 "tensor 'model.layers.0.mlp.down_proj.qweight' has shape \[15,64\], expected \[16,64\]" "$d"
# a NaN scale: refused naming the scales tensor and the element
d=$(mkqckpt q-nan tiny-mistral-awq)
st_rewrite "$d/model.safetensors" 't["model.layers.1.self_attn.o_proj.scales"][2][2 * 70:2 * 71] = b"\x00\x7e"'
compile_fails 1 "weight 'model.layers.1.self_attn.o_proj.scales' \(f16\): element 70 \[1,6\] is NaN" "$d"
# a qzeros of another dtype
d=$(mkqckpt q-zdtype tiny-mistral-awq)
st_rewrite "$d/model.safetensors" 't["model.layers.0.mlp.up_proj.qzeros"][0] = "F32"'
compile_fails 1 "tensor 'model.layers.0.mlp.up_proj.qzeros' has dtype f32; kiln reads I32" "$d"
# compressed-tensors (pack-quantized int4, W4A16): read; its other schemes and broken tensors refused by name
QC="$SRC/tests/data/tiny-mistral-ct"
expect 0 "wrote" -- "$KILN" compile "$QC" -o "$T/qc.kiln" --target none
"$KILN" inspect "$T/qc.kiln" | grep -Eq "^quantization: q4g32 \(projections\).*checkpoint \(compressed-tensors\)" &&
    ok || bad "inspect does not say the weights came from a compressed-tensors checkpoint"
expect 2 "already quantized.*quant_method \"compressed-tensors\"" -- "$KILN" compile "$QC" -o "$T/qq.kiln" --quant int4
CTG='d["quantization_config"]["config_groups"]["group_0"]'
# float-quantized (FP8) with int weights: the format holds FP8
d=$(mkqckpt c-float tiny-mistral-ct); edit_json "$d/config.json" "$CTG[\"format\"] = \"float-quantized\"; d[\"quantization_config\"][\"format\"] = \"float-quantized\""
compile_fails 1 'quantization_config.config_groups.group_0.weights.type" is "int": the "float-quantized" format kiln reads holds FP8' "$d"
d=$(mkqckpt c-nvfp4 tiny-mistral-ct); edit_json "$d/config.json" "$CTG[\"format\"] = \"nvfp4-pack-quantized\""
compile_fails 1 'quantization_config.config_groups.group_0.format" is "nvfp4-pack-quantized": kiln reads the "pack-quantized" \(int4 groups\) and "float-quantized" \(FP8\) formats only' "$d"
d=$(mkqckpt c-bits tiny-mistral-ct); edit_json "$d/config.json" "$CTG[\"weights\"][\"num_bits\"] = 8"
compile_fails 1 'config_groups.group_0.weights.num_bits" is 8' "$d"
d=$(mkqckpt c-channel tiny-mistral-ct); edit_json "$d/config.json" "$CTG[\"weights\"][\"strategy\"] = \"channel\""
compile_fails 1 'config_groups.group_0.weights.strategy" is "channel"' "$d"
d=$(mkqckpt c-actorder tiny-mistral-ct); edit_json "$d/config.json" "$CTG[\"weights\"][\"actorder\"] = \"columns\""
compile_fails 1 'config_groups.group_0.weights.actorder" is "columns": kiln reads act-order' "$d"
d=$(mkqckpt c-w4a8 tiny-mistral-ct)
edit_json "$d/config.json" "$CTG[\"input_activations\"] = {\"num_bits\": 8, \"type\": \"int\", \"strategy\": \"token\", \"dynamic\": True}"
compile_fails 1 'config_groups.group_0.input_activations" is .*W4A8' "$d"
d=$(mkqckpt c-kv tiny-mistral-ct)
edit_json "$d/config.json" 'd["quantization_config"]["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "strategy": "tensor"}'
compile_fails 1 "tensor 'model.layers.0.self_attn.k_scale' is missing" "$d"
# act-order "group" as the tensors show it: a weight_g_idx the config does not declare is left unused
d=$(mkqckpt c-gidx tiny-mistral-ct)
st_rewrite "$d/model.safetensors" 't["model.layers.0.mlp.up_proj.weight_g_idx"] = ["I32", [64], bytearray(256)]'
compile_fails 1 "model.layers.0.mlp.up_proj.weight_g_idx" "$d"
# actorder "group" declared: each projection's weight_g_idx must be there, and group its columns in whole groups
d=$(mkqckpt c-gidx-missing tiny-mistral-ct-actorder)
st_rewrite "$d/model.safetensors" 'del t["model.layers.1.mlp.down_proj.weight_g_idx"]'
compile_fails 1 "tensor 'model.layers.1.mlp.down_proj.weight_g_idx' is missing" "$d"
d=$(mkqckpt c-gidx-range tiny-mistral-ct-actorder)
st_rewrite "$d/model.safetensors" 'g = t["model.layers.0.self_attn.o_proj.weight_g_idx"][2]; g[0:4] = bytes([2, 0, 0, 0])'
compile_fails 1 "tensor 'model.layers.0.self_attn.o_proj.weight_g_idx' maps input column 0 to group 2: there are groups 0 to 1 only" "$d"
# a projection left unquantized (its name in "ignore"): a .weight where weight_packed should be
d=$(mkqckpt c-ignored tiny-mistral-ct)
st_rewrite "$d/model.safetensors" 'p = "model.layers.1.self_attn.k_proj."; n, k = (int(x) for x in __import__("struct").unpack("<2q", t[p + "weight_shape"][2])); [t.pop(p + s) for s in ("weight_packed", "weight_scale", "weight_shape")]; t[p + "weight"] = ["BF16", [n, k], bytearray(2 * n * k)]'
compile_fails 1 "projection 'model.layers.1.self_attn.k_proj' is not quantized in this compressed-tensors checkpoint \(it has 'model.layers.1.self_attn.k_proj.weight', no 'model.layers.1.self_attn.k_proj.weight_packed'\)" "$d"
# a weight_packed one row short, and a weight_shape that disagrees with config.json
d=$(mkqckpt c-short tiny-mistral-ct)
st_rewrite "$d/model.safetensors" 'w = t["model.layers.0.mlp.down_proj.weight_packed"]; w[1][0] -= 1; del w[2][-4 * w[1][1]:]'
compile_fails 1 "tensor 'model.layers.0.mlp.down_proj.weight_packed' has shape \[63,[0-9]+\], expected \[64,[0-9]+\]" "$d"
d=$(mkqckpt c-wshape tiny-mistral-ct)
st_rewrite "$d/model.safetensors" 't["model.layers.0.self_attn.o_proj.weight_shape"][2][8:16] = (32).to_bytes(8, "little")'
compile_fails 1 "tensor 'model.layers.0.self_attn.o_proj.weight_shape' says the matrix is \[32,...\] in dimension 1" "$d"
# asymmetric without its zero points; a NaN scale named in weight_scale [N, K/G]
d=$(mkqckpt c-nozp tiny-mistral-ct-asym)
st_rewrite "$d/model.safetensors" 'del t["model.layers.1.mlp.gate_proj.weight_zero_point"]'
compile_fails 1 "tensor 'model.layers.1.mlp.gate_proj.weight_zero_point' is missing" "$d"
d=$(mkqckpt c-nan tiny-mistral-ct-asym)
st_rewrite "$d/model.safetensors" 't["model.layers.1.self_attn.o_proj.weight_scale"][2][2 * 5:2 * 6] = b"\x00\x7e"'
compile_fails 1 "weight 'model.layers.1.self_attn.o_proj.weight_scale' \(f16\): element 5 \[2,1\] is NaN" "$d"
# FP8 checkpoints (quant_method fp8 per tensor; compressed-tensors float-quantized per tensor or channel): read as
# they are, the codes copied into fp8; block scales, KV cache schemes, NaN codes and bad scales refused by name
F8T="$SRC/tests/data/tiny-mistral-fp8-tensor" F8C="$SRC/tests/data/tiny-mistral-fp8-channel"
expect 0 "wrote" -- "$KILN" compile "$F8T" -o "$T/f8t.kiln" --target none
"$KILN" inspect "$T/f8t.kiln" | grep -Eq "^quantization: fp8 \(projections\), keep \(LM head\).*read from the checkpoint \(fp8\), codes copied" &&
    ok || bad "inspect of an fp8 checkpoint's engine: $("$KILN" inspect "$T/f8t.kiln" | grep quantization)"
"$KILN" inspect "$T/f8t.kiln" --json | python3 -c 'import json, sys; c = json.load(sys.stdin)["build"]["quant"]["checkpoint"]; assert c["activation_scheme"] == "static" and c["weight_scales"] == "tensor" and "not applied" in c["input_activations"], c' &&
    ok || bad "meta build.quant.checkpoint of an fp8 engine"
expect 0 "wrote" -- "$KILN" compile "$F8C" -o "$T/f8c.kiln" --target none
"$KILN" inspect "$T/f8c.kiln" | grep -Eq "^quantization: fp8 \(projections\).*\(compressed-tensors float-quantized\)" &&
    ok || bad "inspect of a float-quantized checkpoint's engine: $("$KILN" inspect "$T/f8c.kiln" | grep quantization)"
"$KILN" compile "$F8C" -o "$T/f8d.kiln" --target none --dump-ir 2>&1 | grep -q "@model.layers.0.mlp.down_proj.weight{fp8 from compressed-tensors}" &&
    ok || bad "--dump-ir does not show where an fp8 weight came from"
"$KILN" run "$T/f8c.kiln" --prompt-ids 1,50,60 --max-tokens 4 --device cpu >/dev/null 2>"$T/err" && ok || bad "run an fp8 checkpoint's engine: $(cat "$T/err")"
expect 2 "already quantized.*quant_method \"fp8\"" -- "$KILN" compile "$F8T" -o "$T/qq.kiln" --quant fp8
# transformers' FP8Linear names (weight_scale_inv, activation_scale for a per-tensor scheme): the same engine
d=$(mkqckpt f-names tiny-mistral-fp8-tensor)
st_rewrite "$d/model.safetensors" 'import re; [t.__setitem__(re.sub(r"weight_scale$", "weight_scale_inv", re.sub(r"input_scale$", "activation_scale", k)), t.pop(k)) for k in list(t) if k.endswith(("weight_scale", "input_scale"))]'
expect 0 "wrote" -- "$KILN" compile "$d" -o "$T/f8n.kiln" --target none
cmp -s "$T/f8t.kiln" "$T/f8n.kiln" && ok || bad "weight_scale_inv / activation_scale names gave another engine"
# block-wise FP8 (DeepSeek-V3 / Qwen3-FP8: weight_block_size [128,128], weight_scale_inv per block) is
# read (test_golden checks its values); blocks of other than 128 columns are refused by name, and so
# are a block scale grid of the wrong shape and a bad scale
d=$(mkqckpt f-blk64 tiny-mistral-fp8-block); edit_json "$d/config.json" 'd["quantization_config"]["weight_block_size"] = [128, 64]'
compile_fails 1 'quantization_config.weight_block_size" is \[128,64\]: kiln reads block-wise FP8 with blocks of 128 columns' "$d"
d=$(mkqckpt f-blkshape tiny-mistral-fp8-block)
st_rewrite "$d/model.safetensors" 'k = "model.layers.0.self_attn.q_proj.weight_scale_inv"; t[k][1] = [2, 1]; t[k][2] = t[k][2] * 2'
compile_fails 1 "model.layers.0.self_attn.q_proj.weight_scale_inv" "$d"
d=$(mkqckpt f-blkzero tiny-mistral-fp8-block)
st_rewrite "$d/model.safetensors" 't["model.layers.1.mlp.down_proj.weight_scale_inv"][2][0:4] = bytes(4)'
compile_fails 1 "tensor 'model.layers.1.mlp.down_proj.weight_scale_inv' \(f32\): element 0 \[0,0\] is 0: an FP8 scale must be finite and positive" "$d"
d=$(mkqckpt f-ctblock tiny-mistral-fp8-channel) # compressed-tensors' FP8_BLOCK is read (test_golden), not [128, 64]
edit_json "$d/config.json" "$CTG[\"weights\"][\"strategy\"] = \"block\"; $CTG[\"weights\"][\"block_structure\"] = [128, 64]"
compile_fails 1 'config_groups.group_0.weights.block_structure" is \[128,64\]: kiln reads block-wise FP8 with blocks of 128 columns' "$d"
d=$(mkqckpt f-ctblock2 tiny-mistral-fp8-channel) # a block config over per-channel scales: the scale's shape
edit_json "$d/config.json" "$CTG[\"weights\"][\"strategy\"] = \"block\"; $CTG[\"weights\"][\"block_structure\"] = [128, 128]"
compile_fails 1 "model.layers.0.self_attn.q_proj.weight_scale" "$d"
# an FP8 KV cache (k_scale / v_scale) is not built: the scheme refused by name, and so are its tensors
d=$(mkqckpt f-kv tiny-mistral-fp8-tensor); edit_json "$d/config.json" 'd["quantization_config"]["kv_cache_scheme"] = "static"'
compile_fails 1 'quantization_config.kv_cache_scheme" is "static": its k_scale and v_scale are read from compressed-tensors' "$d"
d=$(mkqckpt f-kscale tiny-mistral-fp8-tensor)
st_rewrite "$d/model.safetensors" 't["model.layers.0.self_attn.k_scale"] = ["F32", [], bytearray(b"\x00\x00\x80\x3f")]'
compile_fails 1 "tensor 'model.layers.0.self_attn.k_scale' is in the checkpoint but not used" "$d"
# dynamic activations with input scales in the checkpoint: they stay unused, refused by name
d=$(mkqckpt f-dyn tiny-mistral-fp8-tensor); edit_json "$d/config.json" 'd["quantization_config"]["activation_scheme"] = "dynamic"'
compile_fails 1 "tensor 'model.layers.[01].[a-z_]+.[a-z_]+_proj.input_scale' is in the checkpoint but not used.*and 13 other" "$d"
# static without an input scale
d=$(mkqckpt f-noin tiny-mistral-fp8-ct-tensor)
st_rewrite "$d/model.safetensors" 'del t["model.layers.1.mlp.up_proj.input_scale"]'
compile_fails 1 "tensor 'model.layers.1.mlp.up_proj.input_scale' is missing" "$d"
# a NaN code, named by tensor and element; scales that are 0, infinite or negative
d=$(mkqckpt f-nan tiny-mistral-fp8-tensor)
st_rewrite "$d/model.safetensors" 't["model.layers.1.mlp.down_proj.weight"][2][130] = 0xFF'
compile_fails 1 "weight 'model.layers.1.mlp.down_proj.weight' \(f8e4m3\): element 130 \[1,2\] is NaN \(code 0xFF\)" "$d"
d=$(mkqckpt f-zero tiny-mistral-fp8-tensor)
st_rewrite "$d/model.safetensors" 't["model.layers.0.self_attn.o_proj.weight_scale"][2][0:4] = bytes(4)'
compile_fails 1 "tensor 'model.layers.0.self_attn.o_proj.weight_scale' \(f32\): element 0 is 0: an FP8 scale must be finite and positive" "$d"
d=$(mkqckpt f-inf tiny-mistral-fp8-tensor)
st_rewrite "$d/model.safetensors" 't["model.layers.1.self_attn.q_proj.input_scale"][2][0:4] = b"\x00\x00\x80\x7f"'
compile_fails 1 "tensor 'model.layers.1.self_attn.q_proj.input_scale' \(f32\): element 0 is inf" "$d"
d=$(mkqckpt f-neg tiny-mistral-fp8-channel)
st_rewrite "$d/model.safetensors" 't["model.layers.0.mlp.gate_proj.weight_scale"][2][2 * 9 + 1] |= 0x80'
compile_fails 1 "tensor 'model.layers.0.mlp.gate_proj.weight_scale' \(bf16\): element 9 \[9,0\] is -[0-9.e-]+: an FP8 scale must be finite and positive" "$d"
# scales of the wrong shape (a tensor scale where channel scales are declared), codes of another dtype
d=$(mkqckpt f-shape tiny-mistral-fp8-ct-tensor); edit_json "$d/config.json" "$CTG[\"weights\"][\"strategy\"] = \"channel\""
compile_fails 1 "tensor 'model.layers.0.self_attn.q_proj.weight_scale' has shape \[1\], expected \[64,1\]" "$d"
d=$(mkqckpt f-e5m2 tiny-mistral-fp8-tensor)
st_rewrite "$d/model.safetensors" 't["model.layers.0.mlp.up_proj.weight"][0] = "F8_E5M2"'
compile_fails 1 'tensor "model.layers.0.mlp.up_proj.weight": dtype F8_E5M2 is not supported' "$d"
# a projection left unquantized (ignored_layers): its weight bf16, no scales
d=$(mkqckpt f-ignored tiny-mistral-fp8-channel)
st_rewrite "$d/model.safetensors" 'p = "model.layers.1.self_attn.v_proj."; t.pop(p + "weight_scale"); w = t[p + "weight"]; w[0] = "BF16"; w[2] = bytearray(2 * len(w[2]))'
compile_fails 1 "projection 'model.layers.1.self_attn.v_proj' is not quantized in this compressed-tensors checkpoint \(its 'model.layers.1.self_attn.v_proj.weight' is bf16, not FP8 E4M3\)" "$d"
# an FP8 embedding table: E4M3 is read for the projections only
d=$(mkqckpt f-emb tiny-mistral-fp8-tensor)
st_rewrite "$d/model.safetensors" 'w = t["model.embed_tokens.weight"]; w[0] = "F8_E4M3"; w[2] = bytearray(len(w[2]) // 2)'
compile_fails 1 "tensor 'model.embed_tokens.weight' has dtype f8e4m3; kiln reads F32, F16 and BF16 here" "$d"
expect 1 "a quantized checkpoint with --tp 2" -- "$KILN" compile "$QA" -o "$T/qq.kiln" --tp 2 --target none
no_file "$T/qq.kiln"

# a plan the GPU cannot run (ops without GPU kernels): refused when GPU targets are asked for, naming the
# op, and a CPU-only engine (with a note) when the targets are only the default
HAVE_NVRTC=false
"$KILN" compile "$SRC/models/stories260k" -o "$T/probe.kiln" --target sm_90 --passes no-such-pass 2>&1 |
    grep -q "unknown pass" && HAVE_NVRTC=true
if $HAVE_NVRTC; then
    expect 1 "plan op [0-9]+ \(rope\) has no GPU kernel yet.*|hint: compile with --target none" -- \
        "$KILN" compile "$SRC/models/stories260k" -o "$T/np.kiln" --target sm_90 --passes none
    [ -e "$T/np.kiln" ] && bad "a refused compile left $T/np.kiln" || ok
    # an unfused plan: Qwen3's q/k norms run on the GPU only inside qkv_rope
    expect 1 "plan op [0-9]+ \(head_rmsnorm\) has no GPU kernel yet" -- \
        "$KILN" compile "$SRC/tests/data/tiny-qwen3" -o "$T/q3n.kiln" --target sm_90 --passes none
    # constants the kernels do not take (tiny-qwen3's head_dim 24): a note and a CPU-only engine by
    # default, an error naming the constant when GPU targets are asked for
    expect 0 "note: kernels: layer 0: head_dim 24: .*; the engine gets no GPU kernels and runs on the CPU only" -- \
        "$KILN" compile "$SRC/tests/data/tiny-qwen3" -o "$T/q3.kiln"
    "$KILN" inspect "$T/q3.kiln" | grep -q "^targets: none (CPU only: kernels: layer 0: head_dim 24" && ok ||
        bad "tiny-qwen3 engine has GPU targets, or inspect does not say why it has none"
    expect 1 "head_dim 24" -- "$KILN" compile "$SRC/tests/data/tiny-qwen3" -o "$T/q3g.kiln" --target sm_90
    # quantized weights: the GPU kernels read them in bf16 and f16 engines, not in f32 ones
    expect 0 "wrote" -- "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/q4.kiln" --quant int4 --group-size 32
    "$KILN" inspect "$T/q4.kiln" | grep -q "^targets: sm_" && ok || bad "an int4 bf16 engine has no GPU targets"
    expect 1 "weight '.*' is quantized \(q8\): the GPU kernels read quantized weights only in bf16 and f16 engines" -- \
        "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/q8g.kiln" --quant int8 --dtype f32 --target sm_90
    expect 0 "note: weight '.*' is quantized \(q8\).*the engine gets no GPU kernels" -- \
        "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/q8d.kiln" --quant int8 --dtype f32
    # Qwen2's biases fuse into qkv_rope: its engine gets GPU kernels
    expect 0 "wrote" -- "$KILN" compile "$SRC/tests/data/tiny-qwen2" -o "$T/q2.kiln"
    "$KILN" inspect "$T/q2.kiln" | grep -q "^targets: sm_" && ok || bad "tiny-qwen2 engine has no GPU targets"
    # Mixtral's and Qwen3-MoE's experts (moe) run on the GPU: their engines get GPU kernels
    expect 0 "wrote" -- "$KILN" compile "$SRC/tests/data/tiny-mixtral" -o "$T/mx.kiln"
    "$KILN" inspect "$T/mx.kiln" | grep -q "^targets: sm_" && ok || bad "tiny-mixtral engine has no GPU targets"
    expect 0 "wrote" -- "$KILN" compile "$SRC/tests/data/tiny-qwen3-moe" -o "$T/qm90.kiln" --target sm_90
else
    echo "SKIP: GPU-target refusals (this kiln has no NVRTC for sm_90)"
fi

cli_summary

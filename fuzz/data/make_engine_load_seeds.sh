#!/usr/bin/env bash
# make_engine_load_seeds.sh — the seed engines of fuzz/corpus/engine_load:
# tests/data/tiny-mistral compiled as bf16, f32 + compressed, split over 2
# tensor-parallel ranks (plan version 3), quantized (int4 g32, int8 LM head), an act-order GPTQ
# checkpoint (permute ops and +out_perm norms with their i32 orders), with the tiny
# fuzz tokenizer (fuzz/data/tiny_tokenizer*.json), and with a kernels
# section for sm_80 when this kiln has NVRTC. (.seed, not .kiln: .gitignore
# drops *.kiln.)
# usage: bash fuzz/data/make_engine_load_seeds.sh KILN_EXE   (from the repository root)
set -eu
KILN=$1
out=fuzz/corpus/engine_load
mkdir -p "$out"
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
cp -r tests/data/tiny-mistral "$t/ck"
"$KILN" compile "$t/ck" -o "$out/bf16.seed" --target none
"$KILN" compile "$t/ck" -o "$out/f32_zstd.seed" --target none --dtype f32 --compress
"$KILN" compile "$t/ck" -o "$out/tp2.seed" --target none --tp 2
"$KILN" compile "$t/ck" -o "$out/q4.seed" --target none --quant int4 --group-size 32
"$KILN" compile tests/data/tiny-mistral-gptq-actorder -o "$out/actorder.seed" --target none # permute, +out_perm
cp fuzz/data/tiny_tokenizer.json "$t/ck/tokenizer.json"
cp fuzz/data/tiny_tokenizer_config.json "$t/ck/tokenizer_config.json"
"$KILN" compile "$t/ck" -o "$out/tokenizer.seed" --target none
"$KILN" compile "$t/ck" -o "$out/kernels.seed" --target sm_80 || echo "no NVRTC: no kernels seed"
ls -la "$out"

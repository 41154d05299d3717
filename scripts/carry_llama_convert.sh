#!/usr/bin/env bash
# carry_llama_convert.sh — copy llama.cpp's HF -> GGUF converter into
# .carry/llama/convert/ for a device machine that has no llama.cpp checkout
# (bench/gpu_serve_load.sh runs it there; the device has python3 with torch,
# numpy and safetensors, which is all the converter imports for a Llama or
# Mistral checkpoint with a tokenizer.json; yaml is optional).
#
# What the converter reads from its own tree (convert_hf_to_gguf.py adds
# gguf-py/ to sys.path and imports `gguf` and `conversion`):
#   convert_hf_to_gguf.py     the entry point
#   conversion/*.py           its model classes, one module per family; the
#                             module is imported by the architecture's name
#                             (MistralForCausalLM -> conversion/llama.py, with
#                             conversion/__init__.py and conversion/base.py),
#                             so the whole package is copied: other
#                             architectures keep working, 1.5 MB
#   gguf-py/gguf/*.py         the gguf package (writer, constants, vocab,
#                             tensor mapping, lazy tensors, metadata)
# Nothing else: no compiled parts, no data files (gguf-py/gguf/scripts and the
# tests are tools of their own, not imported).
#
# Plus one file of ours, sp-stub/sentencepiece.py: for a Llama/Mistral
# checkpoint the converter first tries tokenizer.model through sentencepiece
# and falls back to tokenizer.json (gguf.LlamaHfVocab) on FileNotFoundError,
# but it imports sentencepiece before looking for the file, so without the
# package the import error ends the conversion. Put sp-stub on PYTHONPATH when
# `import sentencepiece` fails (bench/gpu_serve_load.sh does): the import then
# succeeds, tokenizer.model is absent, and the tokenizer.json path runs. A
# checkpoint that does have a tokenizer.model needs the real package.
#
# usage: bash scripts/carry_llama_convert.sh [LLAMA_CPP_DIR] [DEST]
#   LLAMA_CPP_DIR default ../peer/llama_cpp_python-0.3.36/vendor/llama.cpp
#   DEST          default .carry/llama/convert
# Ends with a `--help` run of the copy (imports everything the entry point
# imports at its top), so a missing file shows here, not on the device.
set -eu
SRC=${1:-../peer/llama_cpp_python-0.3.36/vendor/llama.cpp}
DEST=${2:-.carry/llama/convert}
[ -f "$SRC/convert_hf_to_gguf.py" ] || { echo "carry_llama_convert: no convert_hf_to_gguf.py in $SRC" >&2; exit 1; }
rm -rf "$DEST"
mkdir -p "$DEST/conversion" "$DEST/gguf-py/gguf"
cp "$SRC/convert_hf_to_gguf.py" "$DEST/"
cp "$SRC"/conversion/*.py "$DEST/conversion/"
cp "$SRC"/gguf-py/gguf/*.py "$DEST/gguf-py/gguf/"
[ -f "$SRC/gguf-py/gguf/py.typed" ] && cp "$SRC/gguf-py/gguf/py.typed" "$DEST/gguf-py/gguf/"
cp "$SRC/LICENSE" "$DEST/LICENSE" 2>/dev/null || true
mkdir -p "$DEST/sp-stub"
cat >"$DEST/sp-stub/sentencepiece.py" <<'PY'
"""A stand-in for sentencepiece (scripts/carry_llama_convert.sh): importable, never usable."""


class SentencePieceProcessor:
    def __init__(self, *args, **kwargs):
        raise ImportError("sentencepiece is not installed (this is the stub of scripts/carry_llama_convert.sh)")
PY
python3 "$DEST/convert_hf_to_gguf.py" --help >/dev/null
echo "carry_llama_convert: $(find "$DEST" -type f | wc -l) files, $(du -sh "$DEST" | cut -f1) in $DEST"

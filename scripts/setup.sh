#!/usr/bin/env bash
# setup.sh — the quick start: install the build dependencies, build kiln,
# compile the bundled stories260k model (models/stories260k) into an engine,
# show what it holds, and generate from it with the CPU reference executor;
# then compile models/kjv-tiny and generate text from a text prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
./build/kiln compile models/stories260k -o build/stories260k.kiln
./build/kiln inspect build/stories260k.kiln
./build/kiln run build/stories260k.kiln --prompt-ids 1 --max-tokens 64 --temperature 0 --device cpu
# the quick-start model with a tokenizer (models/kjv-tiny, trained on the King James
# Bible): text in, text out
if [ -f models/kjv-tiny/model.safetensors ]; then
    ./build/kiln compile models/kjv-tiny -o build/kjv-tiny.kiln
    ./build/kiln run build/kjv-tiny.kiln --prompt "In the beginning" --max-tokens 60 --temperature 0 --device cpu
else
    echo "models/kjv-tiny/model.safetensors is not there yet: skipping the text quick start" >&2
fi

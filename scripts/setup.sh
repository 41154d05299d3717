#!/usr/bin/env bash
# setup.sh — the quick start: install the build dependencies, build kiln,
# compile the bundled stories260k model (models/stories260k) into an engine,
# show what it holds, and generate from it with the CPU reference executor.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
./build/kiln compile models/stories260k -o build/stories260k.kiln
./build/kiln inspect build/stories260k.kiln
./build/kiln run build/stories260k.kiln --prompt-ids 1 --max-tokens 64 --temperature 0 --device cpu

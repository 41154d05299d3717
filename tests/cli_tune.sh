#!/usr/bin/env bash
# cli_tune.sh — what `kiln tune` promises without a GPU measurement, through the
# binary: --help (exit 0), usage errors (exit 2 naming the option), a failure
# (no GPU here, or an engine without GPU kernels on a GPU host) exits 1 with
# "kiln tune: error:" and the --json error object, and leaves the engine
# byte-identical; `kiln inspect` says "tuning: none" and --json "tuning": [].
# `kiln compile --tune`'s refusals, and without a GPU its failure before any
# compile. The measurement itself runs in test_gpu_exec (test_tuning_record),
# the append in test_tuning, and compile --tune on a GPU in bench/gpu_tp_run.sh
# (step tune).
#
# usage: bash tests/cli_tune.sh KILN_EXE SOURCE_DIR SHARED_DIR
set -u
KILN=$1
SRC=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-tune-XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/lib_cli.sh"

"$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/m.kiln" --target none >/dev/null 2>&1 || bad "compile failed"
cp "$T/m.kiln" "$T/orig.kiln"

"$KILN" tune --help >"$T/out" 2>&1 && grep -q "usage: kiln tune ENGINE.kiln" "$T/out" && ok || bad "tune --help"
expect 2 "kiln tune: error: --batch 'x' is not a list" -- "$KILN" tune "$T/m.kiln" --batch x
expect 2 "--batch '0,8' is not a list of up to 32 numbers in 1..1024" -- "$KILN" tune "$T/m.kiln" --batch 0,8
expect 2 "--prefill '' is not a list" -- "$KILN" tune "$T/m.kiln" --prefill ''
expect 2 "--gemv-max-m '65' is not a number in 1..64" -- "$KILN" tune "$T/m.kiln" --gemv-max-m 65
expect 2 "--attn-waves '0' is not a number" -- "$KILN" tune "$T/m.kiln" --attn-waves 0
expect 2 "--decode-tc-min '0' is not a number in 1..65536" -- "$KILN" tune "$T/m.kiln" --decode-tc-min 0
expect 1 "kiln tune: error: .*(no CUDA driver|without CUDA|no CUDA device|no GPU kernels)" -- "$KILN" tune "$T/m.kiln" \
    --decode-tc-min 96 # an option in range, not a usage error
expect 2 "expected one engine file" -- "$KILN" tune
expect 2 "unknown or incomplete option '--nope'" -- "$KILN" tune "$T/m.kiln" --nope
expect 1 "kiln tune: error: .*(no CUDA driver|without CUDA|no CUDA device|no GPU kernels)" -- "$KILN" tune "$T/m.kiln"
expect 1 "kiln tune: error: .*(no CUDA driver|without CUDA|no CUDA device|no GPU kernels)" -- "$KILN" tune "$T/m.kiln" \
    --search # an option, not a usage error
cmp -s "$T/m.kiln" "$T/orig.kiln" && ok || bad "a failed tune changed the engine"
"$KILN" tune --json "$T/m.kiln" >"$T/out" 2>/dev/null
rc=$?
[ "$rc" -eq 1 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["error"]["message"]' "$T/out" \
    && ok || bad "tune --json failure: exit $rc, $(cat "$T/out")"
expect 1 "cannot open" -- "$KILN" tune "$T/missing.kiln"

# kiln compile --tune: refused with --target none and --standalone (usage, exit 2); on a host without a
# GPU it fails (exit 1) before compiling, so no engine is written
expect 2 "--tune measures the engine's GPU kernels, and --target none makes none" -- \
    "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/t.kiln" --target none --tune
expect 2 "--tune records into an engine file, not a --standalone executable" -- \
    "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/t" --standalone --tune
if ! "$KILN" tune "$T/m.kiln" 2>&1 | grep -q "no GPU kernels"; then # no usable GPU here
    expect 1 "kiln compile: error: --tune: no GPU to tune on: .*(no CUDA driver|without CUDA|no CUDA device)" -- \
        "$KILN" compile "$SRC/tests/data/tiny-mistral" -o "$T/t.kiln" --tune
    [ ! -e "$T/t.kiln" ] && ok || bad "compile --tune without a GPU wrote an engine"
fi

"$KILN" inspect "$T/m.kiln" | grep -q "^tuning: none" && ok || bad "inspect: no 'tuning: none' line"
"$KILN" inspect --json "$T/m.kiln" | python3 -c 'import json,sys; assert json.load(sys.stdin)["tuning"] == []' \
    && ok || bad "inspect --json: tuning is not []"
cli_summary

#!/usr/bin/env bash
# cli_package.sh — `kiln package` and `kiln compile --standalone`: an
# executable with models/stories260k built in, embedded (a section) and
# appended (after the executable, found through its trailer). Each is run
# from another folder with the engine file gone and must give the ids
# `kiln run` gives on the engine; inspect and bench work; it needs no
# libLLVM; a damaged payload (flipped bytes, cut short, missing trailer) is
# refused with exit 1 and a message naming what is wrong, never a crash.
# On a kiln built without LLVM, checks that `kiln package` says so and skips
# the rest.
#
# usage: bash tests/cli_package.sh KILN_EXE SOURCE_DIR [SHARED_DIR]
set -u
KILN=$1
SRC=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-package-XXXXXX")
trap 'rm -rf "$T"' EXIT
. "$SRC/tests/lib_cli.sh"

run_ids() { "$@" --prompt-ids 1 --max-tokens 10 --temperature 0 --device cpu 2>/dev/null; }
# flip FILE OFFSET: invert one byte (python: no xxd needed)
flip() { python3 -c 'import sys; p, o = sys.argv[1], int(sys.argv[2]); d = bytearray(open(p, "rb").read()); d[o] ^= 0xff; open(p, "wb").write(d)' "$1" "$2"; }

"$KILN" compile "$SRC/models/stories260k" -o "$T/st.kiln" --target none >/dev/null 2>&1 || bad "compile stories260k"
want=$(run_ids "$KILN" run "$T/st.kiln")
[ "$want" = "461 461 401 401 401 461 378 455 473 456" ] && ok || bad "kiln run on the engine gave '$want'"

# ---- usage errors: exit 2, nothing written ----
expect 2 "missing -o" -- "$KILN" package "$T/st.kiln"
expect 2 "missing the engine" -- "$KILN" package -o "$T/x"
expect 2 "unknown --payload" -- "$KILN" package "$T/st.kiln" -o "$T/x" --payload inside
expect 2 "embed-limit" -- "$KILN" package "$T/st.kiln" -o "$T/x" --embed-limit 2T
no_file "$T/x"

# ---- a kiln without LLVM says so ----
if ! "$KILN" package "$T/st.kiln" -o "$T/probe" >/dev/null 2>"$T/probe.err"; then
    if grep -q "built without LLVM" "$T/probe.err"; then
        expect 1 "built without LLVM.*\$|hint: install LLVM" -- "$KILN" package "$T/st.kiln" -o "$T/x"
        no_file "$T/x"
        expect 1 "built without LLVM" -- "$KILN" compile "$SRC/models/stories260k" --standalone -o "$T/x" --target none
        no_file "$T/x"
        expect 1 "built without LLVM" -- "$KILN" package --template -o "$T/x"
        no_file "$T/x"
        expect 1 "not a kiln executable template" -- "$KILN" package "$T/st.kiln" -o "$T/x" --from-template "$T/st.kiln"
        no_file "$T/x"
        echo "skipped: this kiln has no LLVM (KILN_LLVM=OFF or not found), so the packaging tests did not run"
        cli_summary
        exit
    fi
    bad "kiln package failed: $(cat "$T/probe.err")"
fi

# ---- refusals at packaging time ----
cp "$T/st.kiln" "$T/bad.kiln"; flip "$T/bad.kiln" 5000
expect 1 "checksum mismatch" -- "$KILN" package "$T/bad.kiln" -o "$T/x"
no_file "$T/x"
expect 1 "does-not-exist" -- "$KILN" package "$T/does-not-exist.kiln" -o "$T/x"
no_file "$T/x"
expect 1 "cannot run the C compiler driver 'no-such-cc'.*|hint: .*toolchain" -- "$KILN" package "$T/st.kiln" -o "$T/x" --cc no-such-cc
no_file "$T/x"

# package_and_check MODE EXE OPTIONS...: package a copy of the engine, delete
# the copy, run the executable from another folder
mkdir -p "$T/elsewhere"
package_and_check() {
    local mode=$1 exe=$2
    shift 2
    cp "$T/st.kiln" "$T/copy.kiln"
    "$KILN" package "$T/copy.kiln" -o "$exe" "$@" 2>"$T/err" || bad "package ($mode): $(cat "$T/err")"
    grep -q "engine $mode" "$T/err" && ok || bad "package said '$(cat "$T/err")', wanted payload $mode"
    rm -f "$T/copy.kiln"
    got=$(cd "$T/elsewhere" && run_ids "$exe" run)
    [ "$got" = "$want" ] && ok || bad "$mode: $exe run gave '$got', want '$want'"
    "$exe" --version | grep -q "$mode" && ok || bad "$mode: --version does not say $mode"
    (cd "$T/elsewhere" && "$exe" inspect >"$T/inspect.out" 2>&1) && grep -q "kiln engine, format 2" "$T/inspect.out" &&
        grep -q "LlamaForCausalLM, 5 layers" "$T/inspect.out" && ok || bad "$mode: inspect: $(cat "$T/inspect.out")"
    "$exe" inspect --json | python3 -c 'import json,sys; d = json.load(sys.stdin); assert d["file_bytes"] > 0' && ok ||
        bad "$mode: inspect --json"
    "$exe" bench --device cpu --input-len 4 --output-len 4 --reps 1 --warmup 0 >"$T/bench.out" 2>&1 &&
        grep -q "load_ms" "$T/bench.out" && ok || bad "$mode: bench: $(cat "$T/bench.out")"
    expect 2 "takes no engine file" -- "$exe" run "$T/st.kiln" --prompt-ids 1
    expect 2 "unknown command" -- "$exe" compile
    if command -v readelf >/dev/null; then
        readelf -d "$exe" >"$T/dyn" && ! grep -qiE "NEEDED.*(LLVM|nvrtc)" "$T/dyn" && ok ||
            bad "$mode: $exe needs libLLVM or libnvrtc: $(grep NEEDED "$T/dyn")"
    else
        echo "readelf not found: the NEEDED check was skipped"
    fi
}

# ---- embedded (the default for a small engine) ----
package_and_check embedded "$T/emb"
# the section: read-only, 4096-aligned, holds the engine
if command -v readelf >/dev/null; then
    sec=$(readelf -W -S "$T/emb" | grep ' .kiln_engine ')
    off=$(echo "$sec" | sed 's/.*\] *//' | awk '{print $4}')
    echo "$sec" | awk '{print $NF}' | grep -qx 4096 && ! echo "$sec" | grep -q ' WA ' && ok ||
        bad "the .kiln_engine section is not read-only and 4096-aligned: $sec"
    # flipped bytes in the weights (past the header and the first page)
    cp "$T/emb" "$T/emb-flip"; flip "$T/emb-flip" $((0x$off + 100000))
    expect 1 "emb-flip: section 'weights' checksum mismatch" -- "$T/emb-flip" run --prompt-ids 1 --device cpu
    cp "$T/emb" "$T/emb-hdr"; flip "$T/emb-hdr" $((0x$off + 20))
    expect 1 "header checksum mismatch" -- "$T/emb-hdr" inspect
    # cut short inside the engine (the last segment of the file): refused before a byte of it is read
    head -c $((0x$off + 100000)) "$T/emb" >"$T/emb-cut"; chmod +x "$T/emb-cut"
    expect 1 "emb-cut: the executable is truncated: $((0x$off + 100000)) bytes" -- "$T/emb-cut" run --prompt-ids 1 --device cpu
    expect 1 "executable is truncated" -- "$T/emb-cut" inspect
    # the engine is the last loaded segment: nothing the loader needs comes after it
    last=$(readelf -W -l "$T/emb" | awk '$1 == "LOAD" {o = $2} END {print o}')
    [ "$((last))" -eq "$((0x$off))" ] && ok || bad "the .kiln_engine section (0x$off) is not the last LOAD segment ($last)"
fi

# ---- appended: forced, and chosen by a small --embed-limit ----
package_and_check appended "$T/app" --payload appended
package_and_check appended "$T/app2" --embed-limit 64K
size=$(stat -c %s "$T/app")
tail -c 64 "$T/app" | head -c 7 | grep -q KILNPAY && ok || bad "no KILNPAY trailer at the end of the appended executable"
# missing trailer: the executable cut short
head -c $((size - 10)) "$T/app" >"$T/app-cut"; chmod +x "$T/app-cut"
expect 1 "trailer is missing.*truncated" -- "$T/app-cut" run --prompt-ids 1 --device cpu
head -c $((size - 300000)) "$T/app" >"$T/app-cut2"; chmod +x "$T/app-cut2"
expect 1 "trailer is missing" -- "$T/app-cut2" inspect
# engine cut short, trailer kept
python3 -c 'import sys; d = open(sys.argv[1], "rb").read(); open(sys.argv[2], "wb").write(d[:-64-5000] + d[-64:])' "$T/app" "$T/app-short"
chmod +x "$T/app-short"
expect 1 "does not end where the trailer starts" -- "$T/app-short" inspect
# flipped bytes: in the engine's weights (its first section, at 4096), in the engine's header, in the trailer
# (bytes between sections are alignment padding, which readers ignore: docs/engine-format.md)
off=$(python3 -c 'import sys, struct; d = open(sys.argv[1], "rb").read(); print(struct.unpack("<Q", d[-48:-40])[0])' "$T/app")
cp "$T/app" "$T/app-flip"; flip "$T/app-flip" $((off + 4096 + 5000))
expect 1 "app-flip: section 'weights' checksum mismatch" -- "$T/app-flip" run --prompt-ids 1 --device cpu
cp "$T/app" "$T/app-hdr"; flip "$T/app-hdr" $((off + 3))
expect 1 "not a kiln engine file" -- "$T/app-hdr" inspect
cp "$T/app" "$T/app-tr"; flip "$T/app-tr" $((size - 40))
expect 1 "trailer checksum does not match" -- "$T/app-tr" inspect --json
# another engine spliced in with its own valid trailer: not the one this executable was built with
"$KILN" compile "$SRC/models/stories260k" -o "$T/f16.kiln" --target none --dtype f16 >/dev/null 2>&1 || bad "compile f16"
"$KILN" package "$T/f16.kiln" -o "$T/app-f16" --payload appended 2>/dev/null || bad "package f16"
python3 -c 'import sys; a = open(sys.argv[1], "rb").read(); b = open(sys.argv[2], "rb").read(); o = int(sys.argv[4]); open(sys.argv[3], "wb").write(a[:o] + b[o:])' "$T/app" "$T/app-f16" "$T/app-other" "$off"
chmod +x "$T/app-other"
expect 1 "appended engine .* is not the one this executable was built with" -- "$T/app-other" inspect

# ---- templates: made with LLVM, an engine attached without it ----
expect 2 "takes no engine file" -- "$KILN" package --template "$T/st.kiln" -o "$T/x"
expect 2 "only one of" -- "$KILN" package --template --from-template "$T/app" -o "$T/x"
"$KILN" package --template -o "$T/tpl" 2>"$T/err" || bad "package --template: $(cat "$T/err")"
"$T/tpl" --version | grep -q "template.*none yet" && ok || bad "template --version: $("$T/tpl" --version)"
expect 1 "trailer is missing.*|hint: this is a template" -- "$T/tpl" run --prompt-ids 1 --device cpu
cp "$T/st.kiln" "$T/copy.kiln"
"$KILN" package "$T/copy.kiln" -o "$T/from" --from-template "$T/tpl" 2>"$T/err" || bad "--from-template: $(cat "$T/err")"
rm -f "$T/copy.kiln"
got=$(cd "$T/elsewhere" && run_ids "$T/from" run)
[ "$got" = "$want" ] && ok || bad "--from-template: run gave '$got'"
"$T/from" --version | grep -q "template.*appended" && ok || bad "from-template --version: $("$T/from" --version)"
expect 1 "already has an engine appended" -- "$KILN" package "$T/st.kiln" -o "$T/x" --from-template "$T/from"
expect 1 "not a kiln executable template" -- "$KILN" package "$T/st.kiln" -o "$T/x" --from-template "$T/emb"
expect 1 "checksum mismatch" -- "$KILN" package "$T/bad.kiln" -o "$T/x" --from-template "$T/tpl"
no_file "$T/x"
foff=$(python3 -c 'import sys, struct; d = open(sys.argv[1], "rb").read(); print(struct.unpack("<Q", d[-48:-40])[0])' "$T/from")
cp "$T/from" "$T/from-flip"; flip "$T/from-flip" $((foff + 4096 + 5000))
expect 1 "checksum mismatch" -- "$T/from-flip" inspect

# ---- kiln compile --standalone ----
"$KILN" compile "$SRC/models/stories260k" --standalone -o "$T/sc" --target none 2>"$T/err" || bad "compile --standalone: $(cat "$T/err")"
got=$(cd "$T/elsewhere" && run_ids "$T/sc" run)
[ "$got" = "$want" ] && ok || bad "compile --standalone: run gave '$got'"
ls "$T"/sc.engine.* >/dev/null 2>&1 && bad "compile --standalone left its temporary engine" || ok
compile_dir_fail=$(mkckpt broken); rm "$compile_dir_fail/config.json"
expect 1 "config.json" -- "$KILN" compile "$compile_dir_fail" --standalone -o "$T/sc2" --target none
no_file "$T/sc2"
ls "$T"/sc2.engine.* >/dev/null 2>&1 && bad "a failed compile --standalone left its temporary engine" || ok

cli_summary

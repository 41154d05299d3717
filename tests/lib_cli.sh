# lib_cli.sh — what the CLI test scripts (tests/cli_*.sh) share: the pass
# and fail counters, the expect / no_file checks, copies of the tiny
# checkpoint to break, and small file writers. Sourced, not run: the sourcing
# script sets KILN (the kiln binary), SRC (the source tree) and T (a
# temporary folder it removes), and ends with `cli_summary`.
pass=0
fail=0

# expect CODE PATTERN -- command...: exit code CODE, stderr matching PATTERN (grep -E)
expect() {
    local code=$1 pattern=$2
    shift 3
    "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    if [ "$rc" -ne "$code" ] || ! grep -Eq -- "$pattern" "$T/err"; then
        echo "FAIL: $* -> exit $rc (want $code), stderr:" >&2
        sed 's/^/    /' "$T/err" >&2
        echo "    (wanted /$pattern/)" >&2
        fail=$((fail + 1))
    else
        pass=$((pass + 1))
    fi
}

# no_file PATH: nothing at PATH and no temporary file beside it
no_file() {
    if [ -e "$1" ] || ls "$1".tmp.* >/dev/null 2>&1; then
        echo "FAIL: $1 (or a temporary file beside it) was left behind" >&2
        fail=$((fail + 1))
    else
        pass=$((pass + 1))
    fi
}

# mkckpt NAME: a copy of the tiny Mistral checkpoint to break
mkckpt() {
    rm -rf "$T/$1"
    cp -r "$SRC/tests/data/tiny-mistral" "$T/$1"
    chmod -R u+w "$T/$1"
    echo "$T/$1"
}

# compile_fails CODE PATTERN DIR: compiling DIR fails as said and leaves no engine
compile_fails() {
    expect "$1" "$2" -- "$KILN" compile "$3" -o "$T/out.kiln"
    no_file "$T/out.kiln"
}

# edit_json FILE PYTHON-EXPR-ON-d: rewrite a JSON file
edit_json() {
    python3 - "$1" "$2" <<'EOF'
import json, sys
path, expr = sys.argv[1], sys.argv[2]
d = json.load(open(path))
exec(expr)
json.dump(d, open(path, "w"))
EOF
}

# st_write DIR HEADER-JSON DATA-BYTES: a model.safetensors with this header and N data bytes
st_write() {
    python3 - "$1/model.safetensors" "$2" "$3" <<'EOF'
import struct, sys
path, header, n = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
open(path, "wb").write(struct.pack("<Q", len(header)) + header + b"\0" * n)
EOF
}

# ok / bad MESSAGE: count a check that passed or failed
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail + 1)); }

# cli_summary: the closing line ctest reads, and the script's exit status
cli_summary() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}

#!/usr/bin/env python3
"""Checks of the bench scripts that run without a GPU (a few seconds on CPU).

  python3 bench/selftest.py [--peers ../shared/peers]

1. make_checkpoint.py: tiny Mistral (one file and sharded) and tiny Llama-3
   checkpoints load with transformers' AutoModelForCausalLM, with no missing,
   unexpected or mismatched keys, the model's tensors equal the files', the
   shard split equals huggingface_hub's splitter over the same (state-dict)
   order, the same seed gives identical bytes, and a config of the real
   shapes (mistral-7b, llama-3.1-8b) matches the parameter counts of
   BENCHMARKS.md (7.24e9) and the published Llama-3.1-8B (8.03e9).
2. run_peers.py with a fake `kiln` (a shell script printing JSON lines under
   several naming styles): kiln's metrics are mapped onto the canonical names
   and units, floors are filled, a failing or hanging `kiln bench` becomes an
   error record, the deadline turns late steps into skipped records.
3. run_peers.py with fake peer modules that print rows of the real peers'
   formats (the field names are checked against the real files when
   --peers is given), on CPU: the adapters' load, TTFT and row mapping.
4. run_peers.py --dry-run against the real peers (--peers): the modules import
   and take the checkpoint's shapes.
5. compare.py: the markdown has the expected cells, speedups and floors;
   --append-to touches only its section.
6. gpu_bench.sh on the tiny arch with the fake kiln: the files under $OUT, the
   timeline, reuse of the checkpoint in /tmp; --dry-run with the real peers.
7. the real kiln (--kiln, default build-bench/kiln or build/kiln), on CPU:
   its compile and bench output map onto the canonical metrics.
Exits non-zero on the first failed check.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable
sys.path.insert(0, HERE)

FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def run(args, **kw):
    return subprocess.run([PY] + args, capture_output=True, text=True, **kw)


def records(stdout):
    return [json.loads(l) for l in stdout.splitlines() if l.startswith("{")]


# ------------------------------------------------------------------ 1

def test_make_checkpoint(tmp):
    import torch
    import make_checkpoint as mc
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    # parameter counts of the real shapes (no tensors drawn)
    for arch, want in (("mistral-7b", 7_241_732_096), ("llama-3.1-8b", 8_030_261_248)):
        cfg = mc.make_config(arch, None, "bfloat16")
        n = sum(mc.numel(s) for _, s, _ in mc.tensor_plan(cfg))
        check(n == want, f"{arch}: {n} parameters (want {want})")
        sh = mc.split_shards(mc.tensor_plan(cfg), 2, mc.DEFAULT_SHARD_SIZE)
        check(all(sum(mc.numel(s) * 2 for _, s, _ in x) <= 5e9 for x in sh), f"{arch}: {len(sh)} shards, each <= 5 GB")

    cases = [("tiny", "one", []), ("tiny", "sharded", ["--shard-size", "60KB"]),
             ("tiny-llama3", "llama3", ["--layers", "3", "--shard-size", "50000"])]
    for arch, name, extra in cases:
        out = os.path.join(tmp, name)
        r = run([os.path.join(HERE, "make_checkpoint.py"), "--arch", arch, "--out", out, "--seed", "3"] + extra)
        check(r.returncode == 0, f"make_checkpoint {arch} {name}: exit 0 ({r.stderr.strip()[-200:]})")
        line = json.loads(r.stdout.strip().splitlines()[-1])
        files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
        check(line["shards"] == len(files), f"{name}: {len(files)} shard files, as reported")
        model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
        bad = {k: v for k, v in info.items() if v}
        check(not bad, f"{name}: from_pretrained: no missing/unexpected/mismatched keys {bad or ''}")
        check(model.dtype == torch.bfloat16, f"{name}: loads as bf16")
        file_sd = {}
        for f in files:
            file_sd.update(load_file(os.path.join(out, f)))
        sd = model.state_dict()
        check(set(sd) == set(file_sd) and all(torch.equal(sd[k], file_sd[k]) for k in sd),
              f"{name}: model tensors equal the files' ({len(file_sd)} tensors)")
        mats = torch.cat([v.float().flatten() for k, v in file_sd.items() if v.dim() == 2])
        norms = torch.cat([v.float().flatten() for k, v in file_sd.items() if v.dim() == 1])
        check(abs(mats.std().item() - 0.02) < 0.002 and abs(mats.mean().item()) < 0.002,
              f"{name}: matrices ~ normal(0, 0.02) (std {mats.std().item():.4f})")
        check(abs(norms.mean().item() - 1) < 0.01 and 0 < norms.std().item() < 0.05,
              f"{name}: norm weights ~ 1 (mean {norms.mean().item():.4f})")
        if len(files) > 1:
            idx = json.load(open(os.path.join(out, "model.safetensors.index.json")))
            cfg = json.load(open(os.path.join(out, "config.json")))
            plan = mc.tensor_plan(cfg)
            ordered = {n: file_sd[n] for n, _, _ in plan}
            limit = mc.parse_size(extra[extra.index("--shard-size") + 1])
            split = split_torch_state_dict_into_shards(ordered, max_shard_size=limit)
            hub_map = {t: fn for fn, ts in split.filename_to_tensors.items() for t in ts}
            check(idx["weight_map"] == hub_map, f"{name}: shard split == huggingface_hub's ({len(files)} shards)")
            check(idx["metadata"]["total_size"] == sum(v.numel() * 2 for v in file_sd.values()),
                  f"{name}: index total_size")
        else:
            check(not os.path.exists(os.path.join(out, "model.safetensors.index.json")),
                  f"{name}: one shard is model.safetensors with no index")
    a = os.path.join(tmp, "again")
    run([os.path.join(HERE, "make_checkpoint.py"), "--arch", "tiny", "--out", a, "--seed", "3"])
    same = open(os.path.join(a, "model.safetensors"), "rb").read() == \
        open(os.path.join(tmp, "one", "model.safetensors"), "rb").read()
    check(same, "same seed -> identical bytes")
    r = run([os.path.join(HERE, "make_checkpoint.py"), "--arch", "tiny", "--out", a, "--layers", "0"])
    check(r.returncode == 2 and "--layers" in r.stderr, "--layers 0 is a usage error naming --layers")
    return os.path.join(tmp, "one")


# ------------------------------------------------------------------ 2

FAKE_KILN = r"""#!/usr/bin/env bash
# A stand-in for build/kiln: compile writes the engine; bench prints JSON lines
# in the style chosen by $FAKE_STYLE.
cmd=$1; shift
case $cmd in
compile)
  out=""; while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
  [ "${FAKE_COMPILE_FAIL:-0}" = 1 ] && { echo '{"error": {"status": "KILN_ERR_UNSUPPORTED", "code": 5, "message": "config.json: no"}}'; exit 1; }
  sleep "${FAKE_COMPILE_SLEEP:-0}"
  echo engine > "$out"
  echo '{"checkpoint": "x", "output": "'"$out"'", "bytes": 7, "seconds": 0.5}';;
bench)
  eng=$1; shift
  while [ $# -gt 0 ]; do case $1 in --batch) b=$2;; --input-len) i=$2;; --output-len) o=$2;; esac; shift; done
  [ "$b" = 64 ] && [ "${FAKE_HANG64:-0}" = 1 ] && sleep 30
  [ "$b" = 8 ] && [ "${FAKE_FAIL8:-0}" = 1 ] && { echo '{"error": {"status": "KILN_ERR_OOM", "code": 9, "message": "KV pool too small"}}'; exit 1; }
  c='"model": "mistral", "dtype": "bf16", "input_len": '$i', "output_len": '$o', "device": "gpu", "gpu": "fake", "commit": "x"'
  if [ "${FAKE_STYLE:-real}" = real ]; then
    # the names and units of compiler/cmd_bench.c
    echo '{'"$c"', "batch": '$b', "metric": "load_ms", "value": 1500, "unit": "ms"}'
    if [ "$b" != 1 ]; then
      echo '{'"$c"', "batch": 1, "metric": "prefill_ms", "value": 30, "unit": "ms"}'
      echo '{'"$c"', "batch": 1, "metric": "ttft_ms", "value": 31, "unit": "ms"}'
    fi
    echo '{'"$c"', "batch": '$b', "metric": "prefill_ms", "value": 40.0, "unit": "ms"}'
    echo '{'"$c"', "batch": '$b', "metric": "ttft_ms", "value": 41.0, "unit": "ms"}'
    echo '{'"$c"', "batch": '$b', "metric": "decode_ms_per_token", "value": 4.0, "unit": "ms"}'
    echo '{'"$c"', "batch": '$b', "metric": "decode_tokens_per_s", "value": '$((b * 250))', "unit": "tokens/s"}'
    echo '{'"$c"', "batch": '$b', "metric": "peak_host_memory", "value": 100, "unit": "MiB"}'
    echo '{'"$c"', "batch": '$b', "metric": "peak_device_memory", "value": 16000, "unit": "MiB"}'
  else
    # other spellings run_peers.py also understands
    echo '{'"$c"', "batch": '$b', "metric": "prefill_s", "value": 0.040, "unit": "s"}'
    echo '{'"$c"', "batch": '$b', "metric": "ttft", "value": 41000, "unit": "us"}'
    echo '{'"$c"', "batch": '$b', "metric": "decode_tok_per_s", "value": '$((b * 250))'}'
    echo '{'"$c"', "batch": '$b', "metric": "gpu_mem_peak_bytes", "value": 1000}'
    echo '{'"$c"', "batch": '$b', "metric": "kv_blocks", "value": 100, "unit": "blocks"}'
  fi;;
*) exit 2;;
esac
"""


def test_kiln_plumbing(tmp, ckpt):
    import run_peers as rp
    kiln = os.path.join(tmp, "fake-kiln")
    with open(kiln, "w") as f:
        f.write(FAKE_KILN)
    os.chmod(kiln, 0o755)
    eng = os.path.join(tmp, "e.kiln")
    base = [os.path.join(HERE, "run_peers.py"), "--ckpt", ckpt, "--kiln", kiln, "--engine", eng, "--impls", "kiln",
            "--kiln-runs", "1:512:128,8:512:128,64:512:128", "--commit", "abc123"]
    env = dict(os.environ, FAKE_FAIL8="1", FAKE_HANG64="1")
    jl = os.path.join(tmp, "r.jsonl")
    r = run(base + ["--bench-timeout", "3", "--jsonl", jl], env=env, timeout=60)
    check(r.returncode == 0, f"run_peers with fake kiln: exit 0 ({r.stderr.strip()[-300:]})")
    recs = records(r.stdout)
    check("meta" in recs[0] and recs[0]["meta"]["commit"] == "abc123", "first line is meta with the commit")
    ms = [x for x in recs[1:]]
    check(records(open(jl).read()) == recs, "--jsonl holds the same lines as stdout")
    got = {(x["metric"], x["batch"]): x for x in ms if x["impl"] == "kiln"}
    check(("compile_s", None) in got and got[("compile_s", None)]["unit"] == "s", "compile_s recorded")
    p = got.get(("prefill_ms", 1))
    check(p is not None and p["value"] == 40 and p["unit"] == "ms", "prefill_ms kept")
    check(got.get(("load_s", 1), {}).get("value") == 1.5, "load_ms 1500 -> load_s 1.5")
    d = got.get(("decode_tok_per_s", 1))
    check(d is not None and d["value"] == 250 and d["unit"] == "tok/s", "decode_tokens_per_s (tokens/s) -> decode_tok_per_s")
    check(got.get(("peak_gpu_mem_bytes", 1), {}).get("value") == 16000 * 2**20, "peak_device_memory MiB -> peak_gpu_mem_bytes")
    check(got.get(("peak_host_mem_bytes", 1), {}).get("value") == 100 * 2**20, "peak_host_memory MiB -> peak_host_mem_bytes")
    r8 = run(base + ["--kiln-runs", "8:512:128", "--no-compile"], timeout=60)
    b1 = [x for x in records(r8.stdout)[1:] if x["metric"] == "ttft_ms" and x["batch"] == 1]
    check([x["value"] for x in b1] == [31] and b1[0]["input_len"] == 512,
          "the batch-1 lines of a batch-8 run keep batch 1")
    r2 = run(base + ["--kiln-runs", "1:512:128", "--no-compile"], env=dict(os.environ, FAKE_STYLE="alt"), timeout=60)
    alt = {x["metric"]: x for x in records(r2.stdout)[1:]}
    check(abs(alt.get("prefill_ms", {}).get("value", 0) - 40) < 1e-6, "alt: prefill_s 0.040 s -> prefill_ms 40")
    check(abs(alt.get("ttft_ms", {}).get("value", 0) - 41) < 1e-6, "alt: ttft 41000 us -> ttft_ms 41")
    check(alt.get("decode_tok_per_s", {}).get("value") == 250, "alt: decode_tok_per_s without a unit")
    check(alt.get("peak_gpu_mem_bytes", {}).get("value") == 1000, "alt: gpu_mem_peak_bytes (suffix unit)")
    check(alt.get("kv_blocks", {}).get("value") == 100, "alt: an unknown metric is kept under its own name")
    # floors: tiny model, bytes/BW dominates at batch 1
    params, nbytes = recs[0]["meta"]["params"], recs[0]["meta"]["weight_bytes"]
    # tiny: layers x K,V x kv heads x head_dim x bf16 x mean context (512 + 129/2, capped by its window of 64)
    kv = 2 * 2 * 2 * 16 * 2 * min(512 + 129 / 2, 64)
    fl = max((nbytes + kv) / rp.BW, 2 * params / rp.PEAK)
    check(abs(d["floor"] * fl - 1) < 1e-5 and abs(d["frac_of_floor"] / (250 * fl) - 1) < 1e-3,
          "decode floor = (weights + KV read) / 4.2e12 per step; frac = rate / floor rate")
    fp = max(nbytes / rp.BW, 2 * params * 512 / rp.PEAK) * 1e3
    check(abs(p["floor"] / fp - 1) < 1e-5 and abs(p["frac_of_floor"] / (fp / 40) - 1) < 1e-3,
          "prefill floor = max(bytes/BW, 2*params*tokens/PEAK); frac = floor / time")
    e8 = [x for x in ms if x["metric"] == "error" and x["batch"] == 8]
    check(len(e8) == 1 and "KV pool too small" in e8[0]["value"], "failing kiln bench -> its error message")
    e64 = [x for x in ms if x["metric"] == "error" and x["batch"] == 64]
    check(len(e64) == 1 and "timed out" in e64[0]["value"], "hanging kiln bench -> timed out error")
    check("kiln vs peers" in r.stderr, "ratio table printed to stderr")

    # compile failure: error record, no bench run
    r = run(base, env=dict(os.environ, FAKE_COMPILE_FAIL="1"), timeout=60)
    recs = records(r.stdout)[1:]
    check(len(recs) == 1 and recs[0]["metric"] == "error" and "config.json: no" in recs[0]["value"],
          "failing kiln compile -> one error record with kiln's message, no bench runs")
    # deadline: everything after the first step skipped
    r = run(base + ["--deadline", "10", "--min-step", "9"], env=dict(os.environ, FAKE_COMPILE_SLEEP="2"), timeout=60)
    recs = records(r.stdout)[1:]
    check(sum(x["metric"] == "skipped" for x in recs) == 3, "deadline reached -> later runs recorded as skipped")
    # usage errors
    r = run([os.path.join(HERE, "run_peers.py"), "--ckpt", ckpt, "--kiln-runs", "1:512"])
    check(r.returncode == 2 and "BATCH:INPUT_LEN:OUTPUT_LEN" in r.stderr, "bad --kiln-runs is a usage error")
    r = run([os.path.join(HERE, "run_peers.py"), "--ckpt", ckpt, "--impls", "kiln,hf"])
    check(r.returncode == 2 and "--peers" in r.stderr, "hf without --peers is a usage error")
    return jl


# ------------------------------------------------------------------ 3

FAKE_HF = '''
import json, os, time, torch
OUT = os.environ.get("OUT", "/tmp")
def rec(name, **kw):
    raise SystemExit("the adapter should have replaced rec")
def cuda_time(fn, warm=3, reps=10):
    return 0.0
def hf_runs(model, label):
    for L in (512, 2048):
        rec(f"{label}_prefill", batch=1, prompt=L, seconds=L / 1e5, tok_per_s=1e5, TFLOPs=1.0)
    for B in (1, 8, 64):
        rec(f"{label}_generate", batch=B, prompt=512, new=128, ttft_s=0.0268,
            decode_ms_per_step=23.1, decode_tok_per_s=B * 43.0, e2e_tok_per_s=B * 40.0)
'''

FAKE_GPTFAST = '''
import json, os
D, L, H, KV, HD, FF, V = 4096, 32, 32, 8, 128, 14336, 32000
MAXLEN = 1024
OUT = os.environ.get("OUT", "/tmp")
class Model:
    def __init__(s, B):
        pass
def main(B=1, prompt=512, new=128):
    r = dict(name="gptfast_compiled_decode", batch=B, prompt=prompt, new=new, compile_warmup_s=30.0,
             decode_ms_per_step=4.96, decode_tok_per_s=B * 202.0, weight_GB=D * 1e-9, implied_GBps=1.0)
    with open(os.path.join(OUT, "baselines.jsonl"), "a") as f:
        f.write(json.dumps(r) + "\\n")
'''


def test_peer_adapters(tmp, ckpt, real_peers):
    fake = os.path.join(tmp, "fake-peers")
    os.makedirs(fake, exist_ok=True)
    open(os.path.join(fake, "hf_baselines.py"), "w").write(FAKE_HF)
    open(os.path.join(fake, "gptfast_decode.py"), "w").write(FAKE_GPTFAST)
    if real_peers:
        # the fakes' row fields must be the real peers' ones
        hf = open(os.path.join(real_peers, "hf_baselines.py")).read()
        gf = open(os.path.join(real_peers, "gptfast_decode.py")).read()
        for fld in ("batch=B, prompt=512, new=128, ttft_s=", "decode_ms_per_step=", "decode_tok_per_s=",
                    "e2e_tok_per_s=", "batch=1, prompt=L, seconds=t", "_prefill", "_generate", "def hf_runs(model, label)"):
            check(fld in hf, f"real hf_baselines.py has {fld!r}")
        for fld in ("batch=B, prompt=prompt, new=new, compile_warmup_s=warm", "decode_ms_per_step=",
                    "decode_tok_per_s=", 'os.path.join(OUT, "baselines.jsonl")', "def main(B=1, prompt=512, new=128)"):
            check(fld in gf, f"real gptfast_decode.py has {fld!r}")
    r = run([os.path.join(HERE, "run_peers.py"), "--ckpt", ckpt, "--peers", fake, "--impls", "hf,gptfast",
             "--peer-device", "cpu", "--gptfast-batches", "1,8", "--commit", "c"], timeout=300)
    check(r.returncode == 0, f"run_peers with fake peers on CPU: exit 0 ({r.stderr.strip()[-400:]})")
    recs = records(r.stdout)[1:]
    hf = {(x["metric"], x["batch"], x["input_len"]): x for x in recs if x["impl"] == "hf"}
    check(("load_s", None, None) in hf and hf[("load_s", None, None)]["value"] > 0, "hf load_s from from_pretrained")
    t = hf.get(("ttft_ms", 1, 128))
    check(t is not None and t["value"] > 0 and t["output_len"] == 1, "hf TTFT of a 128-token prompt measured")
    check(abs(hf[("prefill_ms", 1, 2048)]["value"] - 20.48) < 1e-6, "hf prefill seconds -> prefill_ms")
    check(hf[("decode_tok_per_s", 64, 512)]["value"] == 64 * 43.0 and hf[("decode_tok_per_s", 64, 512)]["output_len"] == 128,
          "hf generate rows -> decode_tok_per_s per batch")
    check(abs(hf[("ttft_ms", 8, 512)]["value"] - 26.8) < 1e-6, "hf ttft_s -> ttft_ms")
    gf = {(x["metric"], x["batch"]): x for x in recs if x["impl"] == "gptfast"}
    check(gf.get(("decode_tok_per_s", 8), {}).get("value") == 8 * 202.0, "gptfast batch 8 row read back")
    check(("compile_warmup_s", 1) in gf, "gptfast compile warm-up recorded")
    check(not [x for x in recs if x["metric"] == "error"], "no error records")


# ------------------------------------------------------------------ 4

def test_dry_run(ckpt, real_peers):
    r = run([os.path.join(HERE, "run_peers.py"), "--ckpt", ckpt, "--peers", real_peers, "--dry-run",
             "--kiln", "/nonexistent/kiln"], timeout=300)
    check(r.returncode == 0, f"--dry-run against the real peers: exit 0 ({r.stderr.strip()[-300:]})")
    recs = records(r.stdout)
    cmds = [x["dry_run"] for x in recs if "dry_run" in x]
    check(len(cmds) == 6 and cmds[0][1] == "compile" and cmds[1][:2] == ["/nonexistent/kiln", "bench"]
          and "--device" in cmds[1], "dry run lists kiln compile + 5 kiln bench commands")
    chk = [x["dry_run_check"] for x in recs if "dry_run_check" in x]
    check(len(chk) == 3 and all(c["metric"] == "check" and " ok" in c["value"] for c in chk),
          "real hf_baselines / gptfast_decode import and take the checkpoint's shapes")


# ------------------------------------------------------------------ 5

def test_compare(tmp):
    import compare
    meta = {"meta": {"model": "mistral-7b", "layers": 32, "dtype": "bf16", "params": 7241732096,
                     "weight_bytes": 14483464192, "gpu": "NVIDIA H200", "commit": "abc", "date": "2026-11-29T10:00:00Z",
                     "torch": "2.11.0", "transformers": "5.17.0", "floor_bw_Bps": 4.2e12, "floor_peak_flops": 785e12,
                     "decode_step_floor_ms_b1": 3.4484}}

    def m(impl, metric, value, unit, b=None, i=None, o=None, floor=None, frac=None):
        return {"impl": impl, "metric": metric, "value": value, "unit": unit, "batch": b, "input_len": i,
                "output_len": o, "floor": floor, "frac_of_floor": frac}
    rows = [m("kiln", "decode_tok_per_s", 270.0, "tok/s", 1, 512, 128, 290.0, 0.931),
            m("hf", "decode_tok_per_s", 43.0, "tok/s", 1, 512, 128, 290.0, 0.148),
            m("gptfast", "decode_tok_per_s", 202.0, "tok/s", 1, 512, 128, 290.0, 0.697),
            m("kiln", "prefill_ms", 50.0, "ms", 1, 2048, 16, 37.8, 0.756),
            m("hf", "prefill_ms", 59.1, "ms", 1, 2048, 0, 37.8, 0.64),
            m("kiln", "compile_s", 45.0, "s"),
            m("kiln", "kv_blocks", 100, "blocks", 1, 512, 128),
            m("gptfast", "error", "boom", None, 8, 512, 128)]
    p = os.path.join(tmp, "cmp.jsonl")
    with open(p, "w") as f:
        f.write("not json\n" + json.dumps(meta) + "\n" + "\n".join(json.dumps(x) for x in rows) + "\n")
    md = compare.markdown(*compare.load([p]))
    print(md)
    line = next((l for l in md.splitlines() if l.startswith("| decode, batch 1")), "")
    check("270 tok/s (93%)" in line and "43.0 tok/s (15%)" in line and "202 tok/s (70%)" in line,
          "decode row: values with fractions of floor")
    check("6.28×" in line and "1.34×" in line and "≥ 260 tok/s ✓" in line, "decode row: speedups and target met")
    pre = next((l for l in md.splitlines() if l.startswith("| prefill 2048")), "")
    check("1.18×" in pre and "≤ 48 ms ✗" in pre and "37.8 ms" in pre,
          "prefill row: matched across output lengths, time speedup = peer/kiln, floor, target missed")
    check("| compile (cold kernel cache) |" in md and "≤ 60 s ✓" in md, "compile row")
    check("| kv_blocks | 1 | 512 | 128 | 100 blocks |" in md, "other measurements table")
    check("- gptfast error (batch 8, 512/128): boom" in md, "errors listed")
    check("NVIDIA H200 — 2026-11-29, commit abc" in md, "title has GPU, date, commit")
    rt = compare.ratio_table(compare.load([p])[1])
    check("6.28x" in rt and "1.18x" in rt, "plain ratio table")
    # --append-to keeps other sections
    doc = os.path.join(tmp, "benchmarks.md")
    with open(doc, "w") as f:
        f.write("# kiln benchmarks\n\n## CPU benchmarks\n\ntheirs\nNo run has been recorded yet.\n\n"
                "## GPU benchmarks\n\nintro\n\nNo run has been recorded yet.\n\n## Later\n\nkeep\n")
    r = run([os.path.join(HERE, "compare.py"), p, "--append-to", doc])
    text = open(doc).read()
    check(r.returncode == 0 and text.index("intro") < text.index("### mistral-7b") < text.index("## Later")
          and "theirs\nNo run has been recorded yet." in text and text.count("No run has") == 1
          and text.endswith("## Later\n\nkeep\n"), "--append-to: block at the end of its section only, placeholder gone")
    doc2 = os.path.join(tmp, "new.md")
    run([os.path.join(HERE, "compare.py"), p, "--append-to", doc2])
    check("## GPU benchmarks\n\n### mistral-7b" in open(doc2).read(), "--append-to creates the section")


# ------------------------------------------------------------------ 6

def test_gpu_bench_sh(tmp, real_peers):
    kiln = os.path.join(tmp, "fake-kiln")  # written by test_kiln_plumbing
    out = os.path.join(tmp, "out")
    sh = os.path.join(HERE, "gpu_bench.sh")
    r = subprocess.run(["bash", sh, "--arch", "tiny", "--kiln", kiln, "--no-peers", "--budget", "120", "--fresh"],
                       capture_output=True, text=True, env=dict(os.environ, OUT=out, KILN_COMMIT="feed"), timeout=200)
    check(r.returncode == 0, f"gpu_bench.sh --arch tiny with fake kiln: exit 0 ({r.stdout[-300:]}{r.stderr[-300:]})")
    files = sorted(os.listdir(out))
    check(files == ["bench.log", "env.log", "results.jsonl", "table.md", "timeline.log"], f"$OUT holds {files}")
    tl = open(os.path.join(out, "timeline.log")).read()
    check("start checkpoint" in tl and "end   checkpoint rc=0" in tl and "end   measure rc=0" in tl,
          "timeline.log has start/end of each part")
    recs = records(open(os.path.join(out, "results.jsonl")).read())
    check(recs[0]["meta"]["commit"] == "feed" and any(x.get("metric") == "decode_tok_per_s" for x in recs[1:]),
          "results.jsonl: meta with $KILN_COMMIT, kiln measurements")
    check("| decode, batch 1" in open(os.path.join(out, "table.md")).read(), "table.md written")
    r = subprocess.run(["bash", sh, "--arch", "tiny", "--kiln", kiln, "--no-peers", "--budget", "120"],
                       capture_output=True, text=True, env=dict(os.environ, OUT=out), timeout=200)
    check(r.returncode == 0 and "reuse checkpoint" in open(os.path.join(out, "timeline.log")).read(),
          "a second run reuses the checkpoint in /tmp")
    if real_peers:
        r = subprocess.run(["bash", sh, "--arch", "tiny", "--kiln", "/nonexistent", "--peers", real_peers, "--dry-run",
                            "--budget", "200"], capture_output=True, text=True, env=dict(os.environ, OUT=out), timeout=300)
        n = r.stdout.count('"dry_run_check"')
        check(r.returncode == 0 and n == 3, f"gpu_bench.sh --dry-run checks the real peers ({n} checks)")
    r = subprocess.run(["bash", sh, "--budget", "abc"], capture_output=True, text=True, env=dict(os.environ, OUT=out))
    check(r.returncode == 2 and "--budget" in r.stderr, "gpu_bench.sh: bad --budget is a usage error")


# ------------------------------------------------------------------ 7

def test_real_kiln(tmp, ckpt, kiln):
    """The real kiln on the CPU: its compile and bench output go through run_peers."""
    r = run([os.path.join(HERE, "run_peers.py"), "--ckpt", ckpt, "--kiln", kiln, "--impls", "kiln",
             "--kiln-device", "cpu", "--kiln-runs", "1:16:8,2:32:8", "--engine", os.path.join(tmp, "real.kiln")],
            timeout=300)
    recs = records(r.stdout)[1:]
    check(r.returncode == 0 and not [x for x in recs if x["metric"] == "error"],
          f"real kiln ({kiln}) on CPU: no error ({[x['value'] for x in recs if x['metric'] == 'error']})")
    have = {(x["metric"], x["batch"]) for x in recs}
    want = {("compile_s", None), ("load_s", 1), ("load_s", 2), ("prefill_ms", 1), ("prefill_ms", 2), ("ttft_ms", 2),
            ("decode_ms_per_token", 2), ("decode_tok_per_s", 1), ("decode_tok_per_s", 2)}
    check(want <= have, f"real kiln: every canonical metric present (missing {sorted(want - have, key=str)})")
    known = {"compile_s", "load_s", "prefill_ms", "ttft_ms", "decode_ms_per_token", "decode_tok_per_s",
             "peak_host_mem_bytes", "peak_gpu_mem_bytes"}
    check({x["metric"] for x in recs} <= known, f"real kiln: no unmapped metric ({ {x['metric'] for x in recs} - known })")
    check(all(x["device"] == "cpu" for x in recs if x["metric"] != "compile_s"), "real kiln: device recorded")


def main():
    ap = argparse.ArgumentParser()
    default_peers = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "peers")
    ap.add_argument("--peers", default=default_peers if os.path.isdir(default_peers) else None)
    repo = os.path.dirname(HERE)
    kilns = [os.path.join(repo, d, "kiln") for d in ("build-bench", "build")]
    ap.add_argument("--kiln", default=next((k for k in kilns if os.access(k, os.X_OK)), None),
                    help="a built kiln for test 7 (default build-bench/kiln or build/kiln when present)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln-bench-selftest-")
    try:
        ckpt = test_make_checkpoint(tmp)
        test_kiln_plumbing(tmp, ckpt)
        test_peer_adapters(tmp, ckpt, a.peers)
        if a.peers:
            test_dry_run(ckpt, a.peers)
        else:
            print("skip dry run against the real peers: no --peers folder")
        test_compare(tmp)
        test_gpu_bench_sh(tmp, a.peers)
        if a.kiln:
            test_real_kiln(tmp, ckpt, a.kiln)
        else:
            print("skip the real kiln: none built (--kiln BIN)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{'FAILED: ' + str(len(FAILS)) if FAILS else 'all bench self-tests passed'}")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())

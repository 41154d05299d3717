#!/usr/bin/env python3
"""Run kiln and its peers on one checkpoint, in one command, on one GPU.

  python3 bench/run_peers.py --ckpt /tmp/mistral-7b --kiln build/kiln --peers .carry/peers \
      --engine /tmp/mistral-7b.kiln --jsonl OUT/results.jsonl

What it measures (../shared/BENCHMARKS.md protocol; ../issues 4 targets):
  kiln     `kiln compile CKPT -o ENGINE --json` (wall time, a fresh NVRTC cache),
           then `kiln bench ENGINE --batch B --input-len I --output-len O
           --device gpu --json` for each --kiln-runs entry (default: decode at
           batch 1, 8, 64 with prompt 512 and 128 new tokens; prefill 2048 at
           batch 1; time to first token of a 128-token prompt)
  hf       peers/hf_baselines.py, imported: the checkpoint is loaded with
           from_pretrained (timed: load_s), then its hf_runs() (prefill 512
           and 2048; generate at batch 1, 8, 64, prompt 512, 128 new tokens),
           plus time to first token of a 128-token prompt measured the way
           hf_runs measures it (generate with one new token)
  gptfast  peers/gptfast_decode.py, imported, its shape constants set from the
           checkpoint's config.json, its main() per --gptfast-batches entry
           (one process each). It draws its own normal(0, 0.02) weights of
           those shapes (it has no loader; values do not change its timing)
           and keeps Mistral's RoPE (theta 10000, no scaling) for Llama too.
The peers' files are used as they are, never modified: the adapters import
them and replace their output function (hf) or read the line they write (gptfast).

Output: one JSON line per measurement on stdout (and appended to --jsonl):
  {"impl", "model", "layers", "dtype", "batch", "input_len", "output_len",
   "metric", "value", "unit", "floor", "frac_of_floor", "device", "gpu",
   "commit", "date", "source"}
metric is one of decode_tok_per_s, decode_ms_per_token, prefill_ms, ttft_ms,
load_s, compile_s, compile_warm_s, peak_gpu_mem_bytes, peak_host_mem_bytes, e2e_tok_per_s,
compile_warmup_s (gpt-fast's torch.compile warm-up), or error / skipped
(value is then the message). kiln's own metric names are mapped onto these
(canon_metric below); one it does not know is kept under its own name.
The first line is {"meta": {...}}: model, params, weight bytes, GPU, commit,
date, versions, the floor constants. A table of kiln against each peer goes
to stderr at the end (compare.py makes the markdown one).

Floors (fraction of floor = floor / measured for times, measured / floor for
rates; 1.0 is the floor):
  a forward over T tokens (T = batch for a decode step, batch * prompt for a
  prefill) cannot beat max((weight_bytes + kv_read) / BW, 2 * params * T / PEAK),
  with BW = 4.2e12 B/s (H200 copy ceiling) and PEAK = 785e12 FLOP/s (bf16
  GEMM); weight_bytes and params count every tensor of the checkpoint, as
  BENCHMARKS.md does (14.48 GB and 7.24e9 for Mistral-7B). kv_read is 0 for
  a prefill and, for a decode step, batch x mean context x KV bytes per
  token (bf16): 64 x 576.5 x 128 KiB = 4.8 GB at batch 64, a third of the
  weights, so batch 64 is not purely weight-bound (BENCHMARKS.md's
  ~14,000 tok/s floor at batch 64 includes it; 2,200 at batch 8).
Load and compile times have no floor here (the issue's targets apply).

Time: --deadline (seconds from start) bounds the whole run; each step gets
min(its own limit, what is left), a step with under --min-step seconds left is
recorded as skipped. Order: kiln compile, kiln bench runs, hf, gptfast.
--dry-run prints the commands and checks that the peers' modules have what
the adapters use (works without a GPU).
"""

import argparse
import datetime
import json
import os
import shlex
import struct
import subprocess
import sys
import tempfile
import time

BW = 4.2e12     # B/s, H200 device copy ceiling (BENCHMARKS.md)
PEAK = 785e12   # FLOP/s, bf16 GEMM 8192^3 through cuBLAS (BENCHMARKS.md)

HERE = os.path.dirname(os.path.abspath(__file__))

# Default kiln bench runs: (batch, input_len, output_len).
DEFAULT_KILN_RUNS = "1:512:128,8:512:128,64:512:128,1:2048:16,1:128:16"

# Rates (higher is better); every other numeric metric is a time (lower is better).
RATE_METRICS = {"decode_tok_per_s", "e2e_tok_per_s", "prefill_tok_per_s"}


# ---------------------------------------------------------------- helpers

def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def log(msg):
    print(f"[run_peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def checkpoint_stats(ckpt):
    """(params, bytes, dtype) of every tensor in the checkpoint, read from the
    safetensors headers (8-byte little-endian length, then JSON)."""
    files = sorted(f for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    if not files:
        raise SystemExit(f"run_peers: {ckpt}: no *.safetensors file")
    params = nbytes = 0
    dtypes = set()
    for f in files:
        with open(os.path.join(ckpt, f), "rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                raise SystemExit(f"run_peers: {f}: shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > 100 << 20:
                raise SystemExit(f"run_peers: {f}: header length {n} is implausible")
            hdr = json.loads(fh.read(n))
        for k, v in hdr.items():
            if k == "__metadata__":
                continue
            cnt = 1
            for s in v["shape"]:
                cnt *= s
            params += cnt
            nbytes += v["data_offsets"][1] - v["data_offsets"][0]
            dtypes.add(v["dtype"])
    dt = {"BF16": "bf16", "F16": "f16", "F32": "f32"}.get(dtypes.pop(), "mixed") if len(dtypes) == 1 else "mixed"
    return params, nbytes, dt


def model_label(ckpt, cfg):
    """The arch name make_checkpoint.py recorded, else the model_type."""
    try:
        with open(os.path.join(ckpt, "random_weights.json")) as f:
            return json.load(f)["arch"]
    except (OSError, ValueError, KeyError):
        return cfg.get("model_type", "unknown")


def gpu_name():
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "none"


def git_commit():
    if os.environ.get("KILN_COMMIT"):
        return os.environ["KILN_COMMIT"]
    try:
        r = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            return r.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "unknown"


def floor_seconds(params, nbytes, tokens, kv_bytes=0):
    """Lower bound for one forward over `tokens` tokens that reads the weights
    and kv_bytes of KV cache."""
    return max((nbytes + kv_bytes) / BW, 2.0 * params * tokens / PEAK)


def kv_bytes_per_token(cfg):
    """Bytes of K and V one token holds over all layers, in bf16."""
    heads = cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return cfg["num_hidden_layers"] * 2 * cfg.get("num_key_value_heads", heads) * hd * 2


def decode_kv_read(rec, kv_tok, window):
    """KV bytes one decode step reads, averaged over the run: batch x the mean
    context (input + (output + 1) / 2, capped by the sliding window)."""
    i, o = rec.get("input_len") or 0, rec.get("output_len") or 0
    ctx = i + (o + 1) / 2 if o else i
    if window:
        ctx = min(ctx, window)
    return (rec.get("batch") or 1) * ctx * kv_tok


def add_floor(rec, params, nbytes, kv_tok=0, window=None):
    """Fill rec["floor"] (in rec's unit) and rec["frac_of_floor"] where the metric has one."""
    m, v = rec.get("metric"), rec.get("value")
    b = rec.get("batch") or 1
    f = None
    if m == "decode_ms_per_token":
        f = floor_seconds(params, nbytes, b, decode_kv_read(rec, kv_tok, window)) * 1e3
    elif m == "decode_tok_per_s":
        f = b / floor_seconds(params, nbytes, b, decode_kv_read(rec, kv_tok, window))
    elif m in ("prefill_ms", "ttft_ms") and rec.get("input_len"):
        f = floor_seconds(params, nbytes, b * rec["input_len"]) * 1e3
    elif m == "prefill_tok_per_s" and rec.get("input_len"):
        f = b * rec["input_len"] / floor_seconds(params, nbytes, b * rec["input_len"])
    if f is None or not isinstance(v, (int, float)) or v <= 0:
        return rec
    rec["floor"] = float(f"{f:.6g}")
    rec["frac_of_floor"] = float(f"{(v / f if m in RATE_METRICS else f / v):.4g}")
    return rec


# ------------------------------------------------------- kiln metric names

_TIME_UNITS = {"s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
               "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "µs": 1e-6, "usec": 1e-6, "ns": 1e-9}
_MEM_UNITS = {"b": 1, "bytes": 1, "byte": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9,
              "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _unit_of(name, unit):
    """The unit given, else one read off the name's suffix (_s, _ms, _us, _bytes)."""
    if unit:
        return str(unit).strip().lower()
    for suf in ("_ms", "_us", "_ns", "_s", "_bytes", "_mib", "_gib", "_mb", "_gb"):
        if name.endswith(suf):
            return suf[1:]
    return ""


def canon_metric(name, value, unit):
    """Map a kiln bench metric (name, value, unit) onto this script's names and
    units. Returns (metric, value, unit); an unknown name is kept as it is."""
    n = name.lower()
    u = _unit_of(n, unit)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return name, value, unit
    is_time = u in _TIME_UNITS
    is_rate = "/s" in u or "per_s" in u or n.endswith(("tok_per_s", "tokens_per_s", "tps", "tok_s"))
    sec = value * _TIME_UNITS[u] if is_time else None
    if "ttft" in n or "first_token" in n:
        if is_time:
            return "ttft_ms", sec * 1e3, "ms"
    elif "prefill" in n:
        if is_rate:
            return "prefill_tok_per_s", value, "tok/s"
        if is_time:
            return "prefill_ms", sec * 1e3, "ms"
    elif "decode" in n or n in ("tok_per_s", "tokens_per_s", "ms_per_token"):
        if is_rate:
            return "decode_tok_per_s", value, "tok/s"
        if is_time:
            return "decode_ms_per_token", sec * 1e3, "ms"
    elif "load" in n:
        if is_time:
            return "load_s", sec, "s"
    elif "compile" in n:
        if is_time:
            return "compile_s", sec, "s"
    elif "mem" in n:
        if u in _MEM_UNITS:
            return ("peak_host_mem_bytes" if "host" in n else "peak_gpu_mem_bytes"), value * _MEM_UNITS[u], "B"
    return name, value, unit


def parse_kiln_output(text):
    """Records from `kiln bench --json` stdout: JSON lines, or one object that
    holds them (a list under any key), or {"error": {...}}."""
    text = text.strip()
    if not text:
        return []
    objs = []
    try:
        whole = json.loads(text)
        objs = whole if isinstance(whole, list) else [whole]
    except ValueError:
        for line in text.splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                objs.append(json.loads(line))
            except ValueError:
                continue
    out = []
    for o in objs:
        if not isinstance(o, dict):
            continue
        if "metric" in o:
            out.append(o)
            continue
        if "error" in o:
            e = o["error"]
            msg = e.get("message", json.dumps(e)) if isinstance(e, dict) else str(e)
            out.append({"metric": "error", "value": msg})
            continue
        for v in o.values():  # {"measurements": [...]}
            if isinstance(v, list):
                out += [x for x in v if isinstance(x, dict) and "metric" in x]
    return out


# ------------------------------------------------------------ the runner

class Runner:
    def __init__(self, a):
        self.a = a
        self.t0 = time.time()
        with open(os.path.join(a.ckpt, "config.json")) as f:
            self.cfg = json.load(f)
        self.params, self.nbytes, self.dtype = checkpoint_stats(a.ckpt)
        self.model = model_label(a.ckpt, self.cfg)
        self.layers = self.cfg.get("num_hidden_layers")
        self.kv_tok = kv_bytes_per_token(self.cfg)
        self.gpu = gpu_name()
        self.commit = a.commit or git_commit()
        self.date = now_iso()
        self.jsonl = open(a.jsonl, "a") if a.jsonl else None
        self.records = []

    def left(self):
        return self.a.deadline - (time.time() - self.t0)

    def emit(self, rec):
        base = {"impl": None, "model": self.model, "layers": self.layers, "dtype": self.dtype,
                "batch": None, "input_len": None, "output_len": None, "metric": None, "value": None,
                "unit": None}
        base.update(rec)
        base.update(device=rec.get("device") or "gpu", gpu=self.gpu, commit=self.commit, date=self.date)
        add_floor(base, self.params, self.nbytes, self.kv_tok, self.cfg.get("sliding_window"))
        line = json.dumps(base)
        self.records.append(base)
        print(line, flush=True)
        if self.jsonl:
            self.jsonl.write(line + "\n")
            self.jsonl.flush()

    def meta(self):
        import platform
        vers = {}
        for mod in ("torch", "transformers"):
            try:  # versions without importing the packages (fast, no CUDA init)
                from importlib.metadata import version
                vers[mod] = version(mod)
            except Exception:
                vers[mod] = None
        m = {"meta": {"model": self.model, "layers": self.layers, "dtype": self.dtype,
                      "params": self.params, "weight_bytes": self.nbytes, "checkpoint": os.path.abspath(self.a.ckpt),
                      "gpu": self.gpu, "commit": self.commit, "date": self.date, "host": platform.node(),
                      "python": platform.python_version(), **vers,
                      "kv_bytes_per_token": self.kv_tok, "floor_bw_Bps": BW, "floor_peak_flops": PEAK,
                      "decode_step_floor_ms_b1": round(floor_seconds(self.params, self.nbytes, 1) * 1e3, 4)}}
        # (decode_step_floor_ms_b1: weights only; the per-line floors add the KV read)
        line = json.dumps(m)
        print(line, flush=True)
        if self.jsonl:
            self.jsonl.write(line + "\n")
            self.jsonl.flush()

    def budget(self, what, cap):
        """Seconds this step may take, or None (then it is recorded as skipped)."""
        if self.left() < self.a.min_step:
            log(f"skip {what}: {self.left():.0f} s left before the deadline")
            return None
        return min(cap, self.left())

    def skipped(self, impl, what, **kw):
        self.emit(dict(impl=impl, metric="skipped", value=f"{what}: deadline ({self.a.deadline:.0f} s) reached", **kw))

    def run_cmd(self, cmd, timeout, env=None):
        """(rc, stdout, seconds); rc 124 on timeout (stdout so far kept)."""
        log("$ " + " ".join(shlex.quote(c) for c in cmd) + f"   (limit {timeout:.0f} s)")
        t = time.time()
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, timeout=timeout,
                               env=env)
            rc, out = r.returncode, r.stdout
        except subprocess.TimeoutExpired as e:
            rc, out = 124, (e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or ""))
        except OSError as e:
            rc, out = 127, ""
            log(f"cannot run {cmd[0]}: {e}")
        dt = time.time() - t
        log(f"  rc={rc}, {dt:.1f} s")
        return rc, out, dt

    # ---- kiln

    def kiln(self):
        a = self.a
        if not a.no_compile:
            cache = tempfile.mkdtemp(prefix="kiln-nvrtc-")  # cold NVRTC cache
            env = dict(os.environ, XDG_CACHE_HOME=cache)
            passes = [("compile_s", "cold NVRTC cache")] + ([("compile_warm_s", "warm NVRTC cache")] if a.compile_warm else [])
            for metric, note in passes:
                t = self.budget("kiln compile", a.compile_timeout)
                if t is None:
                    self.skipped("kiln", "kiln compile")
                    return
                cmd = [a.kiln, "compile", a.ckpt, "-o", a.engine, "--json"] + shlex.split(a.compile_args)
                if a.dry_run:
                    print(json.dumps({"dry_run": cmd}))
                    continue
                rc, out, dt = self.run_cmd(cmd, t, env)
                if rc != 0:
                    msg = parse_kiln_output(out)
                    err = msg[0]["value"] if msg and msg[0].get("metric") == "error" else f"exit {rc}"
                    self.emit(dict(impl="kiln", metric="error", value=f"kiln compile: {err}" +
                                   (" (timed out)" if rc == 124 else "")))
                    return  # no engine: no kiln bench
                inner = None
                try:
                    inner = json.loads(out.strip().splitlines()[-1]).get("seconds")
                except (ValueError, IndexError, AttributeError):
                    pass
                self.emit(dict(impl="kiln", metric=metric, value=round(dt, 3), unit="s",
                               source=f"wall time of kiln compile ({note}); kiln's own seconds: {inner}"))
        elif not a.dry_run and not os.path.exists(a.engine):
            self.emit(dict(impl="kiln", metric="error", value=f"--no-compile: engine {a.engine} does not exist"))
            return

        for (b, i, o) in a.kiln_runs:
            shape = dict(batch=b, input_len=i, output_len=o)
            t = self.budget(f"kiln bench {b}:{i}:{o}", a.bench_timeout)
            if t is None:
                self.skipped("kiln", f"kiln bench {b}:{i}:{o}", **shape)
                continue
            cmd = [a.kiln, "bench", a.engine, "--batch", str(b), "--input-len", str(i), "--output-len", str(o),
                   "--device", a.kiln_device, "--json"] + shlex.split(a.bench_args)
            if a.dry_run:
                print(json.dumps({"dry_run": cmd}))
                continue
            rc, out, dt = self.run_cmd(cmd, t)
            recs = parse_kiln_output(out)
            for r in recs:
                name, val, unit = r.get("metric"), r.get("value"), r.get("unit")
                m, v, u = canon_metric(str(name), val, unit)
                rec = dict(impl="kiln", batch=r.get("batch", b), input_len=r.get("input_len", i),
                           output_len=r.get("output_len", o), metric=m, value=v, unit=u, source=f"kiln bench: {name}",
                           device=r.get("device", a.kiln_device))
                if isinstance(v, float):
                    rec["value"] = round(v, 6)
                self.emit(rec)
            if rc != 0 and not any(r.get("metric") == "error" for r in recs):
                self.emit(dict(impl="kiln", metric="error", value=f"kiln bench exit {rc}" +
                               (" (timed out)" if rc == 124 else ""), **shape))

    # ---- peers (each in a child process of this script)

    def child(self, impl, args, cap, what, **shape):
        a = self.a
        t = self.budget(what, cap)
        if t is None:
            self.skipped(impl, what, **shape)
            return
        fd, emit_path = tempfile.mkstemp(prefix=f"peer-{impl}-", suffix=".jsonl")
        os.close(fd)
        cmd = [sys.executable, os.path.abspath(__file__), "_peer", impl, "--ckpt", a.ckpt, "--peers", a.peers,
               "--emit", emit_path, "--device", a.peer_device] + args + (["--check"] if a.dry_run else [])
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
        # Children's stdout (the peers' own prints) goes to our stderr log.
        log("$ " + " ".join(shlex.quote(c) for c in cmd) + f"   (limit {t:.0f} s)")
        t1 = time.time()
        try:
            p = subprocess.run(cmd, stdout=sys.stderr, stderr=None, timeout=t, env=env)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = 124
        log(f"  rc={rc}, {time.time() - t1:.1f} s")
        got = 0
        with open(emit_path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                rec = json.loads(line)
                if a.dry_run:
                    print(json.dumps({"dry_run_check": rec}))
                else:
                    self.emit(rec)
                got += 1
        os.remove(emit_path)
        if rc != 0:
            self.emit(dict(impl=impl, metric="error", value=f"{what}: exit {rc}" + (" (timed out)" if rc == 124 else ""),
                           **shape))
        return got

    def peers(self):
        a = self.a
        if "hf" in a.impls:
            self.child("hf", [], a.hf_timeout, "hf peer")
        if "gptfast" in a.impls:
            for b in a.gptfast_batches:
                self.child("gptfast", ["--batch", str(b)], a.gptfast_timeout, f"gptfast batch {b}",
                           batch=b, input_len=512, output_len=128)


# ---------------------------------------------- peer adapters (child side)

def peer_main(argv):
    ap = argparse.ArgumentParser(prog="run_peers.py _peer")
    ap.add_argument("impl", choices=["hf", "gptfast"])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--peers", required=True)
    ap.add_argument("--emit", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--check", action="store_true", help="import and check the peer module only (no GPU)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only for bench/selftest.py's fake peers")
    a = ap.parse_args(argv)
    sys.path.insert(0, os.path.abspath(a.peers))
    out = open(a.emit, "a")

    def emit(**rec):
        rec.setdefault("impl", a.impl)
        for k in ("value",):
            if isinstance(rec.get(k), float):
                rec[k] = round(rec[k], 6)
        out.write(json.dumps(rec) + "\n")
        out.flush()

    with open(os.path.join(a.ckpt, "config.json")) as f:
        cfg = json.load(f)
    scratch = tempfile.mkdtemp(prefix=f"peer-{a.impl}-out-")
    os.environ["OUT"] = scratch  # the peers append their own lines to $OUT/baselines.jsonl
    if a.impl == "hf":
        return peer_hf(a, cfg, emit)
    return peer_gptfast(a, cfg, emit, scratch)


def peer_hf(a, cfg, emit):
    import hf_baselines as hb
    missing = [n for n in ("rec", "hf_runs", "cuda_time") if not hasattr(hb, n)]
    if missing:
        emit(metric="error", value=f"hf_baselines.py has no {', '.join(missing)}")
        return 1
    import torch
    import transformers
    cuda = a.device == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()
    if a.check:
        emit(metric="check", value=f"hf_baselines ok (transformers {transformers.__version__}, torch {torch.__version__})")
        return 0

    def rec(name, **kw):
        """Replaces hf_baselines.rec: its rows, mapped onto our metrics."""
        print(json.dumps(dict(kw, name=name)), flush=True)
        if name.endswith("_error"):
            emit(metric="error", value=f"{name}: {kw.get('error')}", source=name)
        elif name.endswith("_prefill"):
            emit(batch=kw["batch"], input_len=kw["prompt"], output_len=0, metric="prefill_ms",
                 value=kw["seconds"] * 1e3, unit="ms", source=f"hf_baselines {name}.seconds")
        elif name.endswith("_generate"):
            sh = dict(batch=kw["batch"], input_len=kw["prompt"])
            emit(**sh, output_len=1, metric="ttft_ms", value=kw["ttft_s"] * 1e3, unit="ms",
                 source=f"hf_baselines {name}.ttft_s")
            emit(**sh, output_len=kw["new"], metric="decode_ms_per_token", value=kw["decode_ms_per_step"],
                 unit="ms", source=f"hf_baselines {name}.decode_ms_per_step")
            emit(**sh, output_len=kw["new"], metric="decode_tok_per_s", value=kw["decode_tok_per_s"],
                 unit="tok/s", source=f"hf_baselines {name}.decode_tok_per_s")
            emit(**sh, output_len=kw["new"], metric="e2e_tok_per_s", value=kw["e2e_tok_per_s"],
                 unit="tok/s", source=f"hf_baselines {name}.e2e_tok_per_s")
    hb.rec = rec

    from transformers import AutoModelForCausalLM
    if cuda:
        torch.cuda.init()
    sync()
    t0 = time.time()
    try:
        model = AutoModelForCausalLM.from_pretrained(a.ckpt, dtype=torch.bfloat16, device_map=a.device,
                                                     attn_implementation="sdpa")
        how = f"from_pretrained(dtype=bf16, device_map='{a.device}', sdpa)"
    except (TypeError, ValueError, ImportError) as e:  # no accelerate / older keyword
        print(f"from_pretrained to {a.device} failed ({e!r}); loading on CPU then .to()", flush=True)
        t0 = time.time()
        model = AutoModelForCausalLM.from_pretrained(a.ckpt, torch_dtype=torch.bfloat16,
                                                     attn_implementation="sdpa").to(a.device)
        how = f"from_pretrained(bf16, sdpa).to('{a.device}')"
    sync()
    emit(metric="load_s", value=time.time() - t0, unit="s", source=f"hf {how}, checkpoint in page cache")
    model.eval()

    # Time to first token of a 128-token prompt, measured as hf_runs measures
    # it at 512 (generate with one new token, after a warm-up).
    try:
        with torch.inference_mode():
            V = model.config.vocab_size
            g = torch.Generator(device=a.device).manual_seed(2)
            ids = torch.randint(0, V, (1, 128), device=a.device, generator=g)

            def gen():
                sync()
                t = time.time()
                model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False, pad_token_id=0)
                sync()
                return time.time() - t
            for _ in range(2):
                gen()
            ts = sorted(gen() for _ in range(5))
            emit(batch=1, input_len=128, output_len=1, metric="ttft_ms", value=ts[2] * 1e3, unit="ms",
                 source="generate(max_new_tokens=1), median of 5")
    except Exception as e:  # report and go on to hf_runs
        emit(metric="error", value=f"hf ttft 128: {e!r}")

    try:
        hb.hf_runs(model, "hf_sdpa")
    except Exception as e:
        emit(metric="error", value=f"hf_runs: {e!r}")
        return 1
    if cuda:
        emit(metric="peak_gpu_mem_bytes", value=torch.cuda.max_memory_allocated(), unit="B",
             source="torch.cuda.max_memory_allocated over the hf run")
    return 0


def peer_gptfast(a, cfg, emit, scratch):
    import gptfast_decode as gf
    need = ("D", "L", "H", "KV", "HD", "FF", "V", "MAXLEN", "main", "Model")
    missing = [n for n in need if not hasattr(gf, n)]
    if missing:
        emit(metric="error", value=f"gptfast_decode.py has no {', '.join(missing)}")
        return 1
    heads = cfg["num_attention_heads"]
    shapes = dict(D=cfg["hidden_size"], L=cfg["num_hidden_layers"], H=heads,
                  KV=cfg.get("num_key_value_heads", heads),
                  HD=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                  FF=cfg["intermediate_size"], V=cfg["vocab_size"])
    for k, v in shapes.items():
        setattr(gf, k, v)
    gf.OUT = scratch
    prompt, new = 512, 128
    if prompt + new + 8 > gf.MAXLEN:
        emit(metric="error", value=f"gptfast MAXLEN {gf.MAXLEN} < prompt {prompt} + new {new}")
        return 1
    if a.check:
        # Build the module on the meta device to check that the shapes took.
        import torch
        with torch.device("meta"):
            m = gf.Model(a.batch)
        n = sum(p.numel() for p in m.parameters())
        emit(metric="check", value=f"gptfast_decode ok: shapes {shapes}, {n} parameters", batch=a.batch)
        return 0
    gf.main(B=a.batch, prompt=prompt, new=new)
    path = os.path.join(scratch, "baselines.jsonl")
    with open(path) as f:
        r = json.loads(f.read().strip().splitlines()[-1])
    sh = dict(batch=r["batch"], input_len=r["prompt"], output_len=r["new"])
    src = "gptfast_decode main(), own random weights of the checkpoint's shapes"
    emit(**sh, metric="decode_ms_per_token", value=r["decode_ms_per_step"], unit="ms", source=src)
    emit(**sh, metric="decode_tok_per_s", value=r["decode_tok_per_s"], unit="tok/s", source=src)
    emit(**sh, metric="compile_warmup_s", value=r["compile_warmup_s"], unit="s",
         source="gptfast torch.compile(mode='reduce-overhead') warm-up (two 8-token runs)")
    return 0


# ------------------------------------------------------------------ main

def parse_runs(s):
    runs = []
    for part in s.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            b, i, o = (int(x) for x in part.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: expected BATCH:INPUT_LEN:OUTPUT_LEN, e.g. 1:512:128")
        if b < 1 or i < 1 or o < 1:
            raise argparse.ArgumentTypeError(f"{part!r}: batch, input and output lengths must be >= 1")
        runs.append((b, i, o))
    return runs


def parse_ints(s):
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: expected a comma list of integers")
    if any(x < 1 for x in v):
        raise argparse.ArgumentTypeError(f"{s!r}: batches must be >= 1")
    return v


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_peer":
        return peer_main(argv[1:])
    ap = argparse.ArgumentParser(description="Run kiln and the peers on one checkpoint; JSON lines on stdout.",
                                 epilog="See the module docstring (bench/run_peers.py) and bench/README.md.")
    ap.add_argument("--ckpt", required=True, help="HF checkpoint directory (bench/make_checkpoint.py)")
    ap.add_argument("--kiln", default="build/kiln", help="the kiln binary (default build/kiln)")
    ap.add_argument("--engine", default=None, help="engine path (default /tmp/<checkpoint name>.kiln)")
    ap.add_argument("--peers", default=None, help="folder holding hf_baselines.py and gptfast_decode.py")
    ap.add_argument("--impls", default="kiln,hf,gptfast", help="comma list of kiln, hf, gptfast (default all)")
    ap.add_argument("--kiln-runs", type=parse_runs, default=parse_runs(DEFAULT_KILN_RUNS),
                    help=f"BATCH:INPUT:OUTPUT list for kiln bench (default {DEFAULT_KILN_RUNS})")
    ap.add_argument("--gptfast-batches", type=parse_ints, default=[1, 8], help="default 1,8")
    ap.add_argument("--compile-args", default="", help="extra arguments for kiln compile (one string)")
    ap.add_argument("--bench-args", default="", help="extra arguments for kiln bench (one string)")
    ap.add_argument("--no-compile", action="store_true", help="reuse --engine as it is")
    ap.add_argument("--compile-warm", action="store_true", help="also time a second compile (warm NVRTC cache)")
    ap.add_argument("--compile-timeout", type=float, default=240)
    ap.add_argument("--bench-timeout", type=float, default=90, help="per kiln bench run")
    ap.add_argument("--hf-timeout", type=float, default=150)
    ap.add_argument("--gptfast-timeout", type=float, default=150, help="per gptfast batch")
    ap.add_argument("--deadline", type=float, default=480, help="seconds for the whole run (default 480)")
    ap.add_argument("--min-step", type=float, default=20, help="skip a step with less than this left (default 20)")
    ap.add_argument("--jsonl", default=None, help="also append the JSON lines to this file")
    ap.add_argument("--commit", default=None, help="commit to record (default $KILN_COMMIT, else git)")
    ap.add_argument("--kiln-device", default="gpu", help="kiln bench --device (default gpu; cpu for tests)")
    ap.add_argument("--peer-device", default="cuda", help=argparse.SUPPRESS)  # cpu: selftest's fake peers
    ap.add_argument("--dry-run", action="store_true",
                    help="print the commands; check the peer modules (no GPU needed); measure nothing")
    a = ap.parse_args(argv)
    a.impls = [x.strip() for x in a.impls.split(",") if x.strip()]
    bad = [x for x in a.impls if x not in ("kiln", "hf", "gptfast")]
    if bad:
        ap.error(f"--impls: unknown {', '.join(bad)} (expected kiln, hf, gptfast)")
    if not os.path.isfile(os.path.join(a.ckpt, "config.json")):
        ap.error(f"--ckpt {a.ckpt}: no config.json there")
    if a.engine is None:
        a.engine = os.path.join(tempfile.gettempdir(), os.path.basename(os.path.normpath(a.ckpt)) + ".kiln")
    if ("hf" in a.impls or "gptfast" in a.impls):
        if a.peers is None:
            ap.error("--peers DIR is needed for the hf and gptfast peers (or --impls kiln)")
        for f in (["hf_baselines.py"] if "hf" in a.impls else []) + (["gptfast_decode.py"] if "gptfast" in a.impls else []):
            if not os.path.isfile(os.path.join(a.peers, f)):
                ap.error(f"--peers {a.peers}: no {f} there")
    if "kiln" in a.impls and not a.dry_run and not (os.path.isfile(a.kiln) and os.access(a.kiln, os.X_OK)):
        ap.error(f"--kiln {a.kiln}: not an executable file (build kiln, or --impls hf,gptfast)")

    r = Runner(a)
    r.meta()
    if "kiln" in a.impls:
        r.kiln()
    r.peers()
    if not a.dry_run:
        sys.path.insert(0, HERE)
        import compare
        print(compare.ratio_table(r.records), file=sys.stderr)
    log(f"done in {time.time() - r.t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

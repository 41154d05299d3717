#!/usr/bin/env python3
"""serve_load.py — a load generator for one OpenAI-compatible server's
POST /v1/completions (kiln serve, llama.cpp's llama-server, vLLM...), streamed.

Standard library only (asyncio and a small HTTP/1.1 client over raw sockets),
so it runs on a machine without a package registry.

Every request is a list of random token ids (so the prompt length is exact,
ids in [--id-low, --vocab) to stay clear of special tokens), streamed with
`stream_options.include_usage`, `ignore_eos` (on by default: every request
then produces exactly its max_tokens) and temperature 0 by default.

Loads:
  closed loop  --concurrency N   N clients, each sending its next request as
                                 soon as the last one ended;
  open loop    --rate R          Poisson arrivals at R requests/s (inf = all
                                 at once), --max-inflight caps those in flight
                                 (an arrival then waits; its TTFT still counts
                                 from its own send);
  SLA          --sla-ttft-ms X   open-loop runs at each of --rates (in turn,
                                 stopping at the first that misses) or, without
                                 --rates, a doubling search from --rate then a
                                 bisection: the largest rate whose P99 TTFT is
                                 under X ms with every request ok.

Measured per request: TTFT (send -> the first chunk carrying a token: a
choice without finish_reason, or any non-empty text), E2E (send -> [DONE]),
TPOT = (E2E - TTFT) / (output tokens - 1) for requests with >= 2 tokens, ITL
(the gaps between chunks carrying tokens; a server may put several tokens in
one chunk, kiln does when it falls behind, so ITL is per chunk). Output tokens
come from the stream's usage (kiln: the extra last chunk; llama-server: the
last content chunk), else from the number of chunks carrying tokens. A request
fails on: an HTTP error, a connection error or timeout, malformed SSE or JSON,
an `error` event, no finish_reason, no [DONE], or (with usage) completion
tokens other than max_tokens under ignore_eos (more than max_tokens without).
Throughput counts the ok requests' tokens over the run's wall time (first send
to last end).

Exit status: 0 every request ok, 1 some failed, 2 bad options.

Examples:
  python3 bench/serve_load.py --url http://127.0.0.1:8000 --concurrency 8 --requests 64 \\
      --input-len 512 --output-len 128 --vocab 32000 --json /tmp/c8.json
  python3 bench/serve_load.py --rate 4 --max-inflight 64 --requests 200 --len-dist lognormal --sigma 0.6
  python3 bench/serve_load.py --sla-ttft-ms 200 --rates 1,2,4,8,16 --requests 100 --json /tmp/sla.json
  python3 bench/serve_load.py --sla-ttft-ms 200 --rate 2 --max-rate 64 --search-steps 3
"""
import argparse
import asyncio
import json
import math
import random
import ssl
import sys
import time
import urllib.parse

MAX_HEAD = 64 * 1024  # bytes of status line + headers
MAX_ERROR_BODY = 4096  # bytes of a non-200 body kept for the reason
MAX_EVENT = 16 * 1024 * 1024  # bytes of one SSE event


class RequestError(Exception):
    """A request failed; the message is the reason reported."""


# ---- HTTP/1.1 over asyncio streams ----

class Target:
    """Where requests go: parsed from --url (http or https, a path prefix allowed)."""

    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("--url must be http://HOST[:PORT][/PREFIX] or https://...: %r" % url)
        self.scheme, self.host = u.scheme, u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        prefix = u.path.rstrip("/")
        # accept both http://h:p and http://h:p/v1 and the full endpoint
        if prefix.endswith("/v1/completions"):
            prefix = prefix[: -len("/v1/completions")]
        elif prefix.endswith("/v1"):
            prefix = prefix[: -len("/v1")]
        self.prefix = prefix
        self.hostport = self.host if u.port is None else "%s:%d" % (self.host, self.port)
        if ":" in self.host and not self.host.startswith("["):
            self.hostport = "[%s]:%d" % (self.host, self.port)

    def path(self, p):
        return self.prefix + p


async def http_open(target, method, path, body, headers):
    """Send one request (Connection: close); return (reader, writer, status, headers lower-cased)."""
    ctx = ssl.create_default_context() if target.scheme == "https" else None
    try:
        reader, writer = await asyncio.open_connection(target.host, target.port, ssl=ctx, limit=MAX_EVENT)
    except OSError as e:
        raise RequestError("connect: %s" % (e.strerror or e))
    lines = ["%s %s HTTP/1.1" % (method, path), "Host: " + target.hostport, "Connection: close",
             "Content-Length: %d" % len(body)]
    lines += ["%s: %s" % kv for kv in headers.items()]
    try:
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        writer.close()
        raise RequestError("connection closed before the response headers")
    except asyncio.LimitOverrunError:
        writer.close()
        raise RequestError("response headers over %d bytes" % MAX_EVENT)
    except OSError as e:
        writer.close()
        raise RequestError("send/receive: %s" % (e.strerror or e))
    if len(head) > MAX_HEAD:
        writer.close()
        raise RequestError("response headers over %d bytes" % MAX_HEAD)
    hl = head.decode("latin-1").split("\r\n")
    st = hl[0].split(" ", 2)
    if len(st) < 2 or not st[0].startswith("HTTP/1.") or not st[1].isdigit():
        writer.close()
        raise RequestError("malformed status line %r" % hl[0][:100])
    hd = {}
    for line in hl[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            hd[k.strip().lower()] = v.strip()
    return reader, writer, int(st[1]), hd


async def http_body(reader, hd):
    """Yield the body's pieces as they arrive: chunked, Content-Length or until the connection closes."""
    try:
        if "chunked" in hd.get("transfer-encoding", "").lower():
            while True:
                line = await reader.readuntil(b"\r\n")
                try:
                    size = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise RequestError("malformed chunk size %r" % line[:40])
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                        pass
                    return
                data = await reader.readexactly(size)
                if await reader.readexactly(2) != b"\r\n":
                    raise RequestError("malformed chunk ending")
                yield data
        elif "content-length" in hd:
            left = int(hd["content-length"])
            while left > 0:
                data = await reader.read(min(left, 65536))
                if not data:
                    raise RequestError("connection closed %d bytes before the body's end" % left)
                left -= len(data)
                yield data
        else:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                yield data
    except asyncio.IncompleteReadError:
        raise RequestError("connection closed in the middle of the body")
    except asyncio.LimitOverrunError:
        raise RequestError("a body line over %d bytes" % MAX_EVENT)
    except OSError as e:
        raise RequestError("receive: %s" % (e.strerror or e))


async def http_get_json(target, path, api_key, timeout):
    async def go():
        h = {"Accept": "application/json"}
        if api_key:
            h["Authorization"] = "Bearer " + api_key
        reader, writer, status, hd = await http_open(target, "GET", target.path(path), b"", h)
        try:
            raw = b"".join([p async for p in http_body(reader, hd)])
        finally:
            writer.close()
        if status != 200:
            raise RequestError("HTTP %d" % status)
        return json.loads(raw)
    return await asyncio.wait_for(go(), timeout)


# ---- one streamed completion ----

def sse_events(buf):
    """Split complete SSE events off buf (a bytearray, consumed): a list of their joined `data:` payloads."""
    out = []
    while True:
        i = buf.find(b"\n\n")
        j = buf.find(b"\r\n\r\n")
        if i < 0 and j < 0:
            return out
        if j >= 0 and (i < 0 or j < i):
            raw, cut = bytes(buf[:j]), j + 4
        else:
            raw, cut = bytes(buf[:i]), i + 2
        del buf[:cut]
        data = []
        for line in raw.split(b"\n"):
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                data.append(line[5:].lstrip(b" ") if line[5:6] == b" " else line[5:])
        if data:  # comments and event:/id: lines alone carry nothing
            out.append(b"\n".join(data))


def chunk_tokens(ev):
    """From one stream chunk: (carries a token, its text, its finish_reason)."""
    choices = ev.get("choices")
    if not isinstance(choices, list):
        raise RequestError("chunk without a choices list: %s" % json.dumps(ev)[:200])
    carries, text, finish = False, "", None
    for c in choices:
        if not isinstance(c, dict):
            raise RequestError("malformed choice: %s" % json.dumps(c)[:200])
        t = c.get("text")
        if t is None and isinstance(c.get("delta"), dict):
            t = c["delta"].get("content")
        t = t if isinstance(t, str) else ""
        f = c.get("finish_reason")
        text += t
        if f is not None:
            finish = f
        # a token chunk: a choice still running (llama-server sends one per token, its text may be
        # empty inside a UTF-8 sequence), or text arriving with the finish (kiln's text never does)
        if f is None or t:
            carries = True
    return carries, text, finish


async def run_one(target, args, req, model):
    """Send one request; return its record (ok or failed with a reason). Never raises."""
    body = {"model": model, "prompt": req["prompt"], "max_tokens": req["output_len"],
            "temperature": args.temperature, "seed": req["seed"], "stream": True,
            "stream_options": {"include_usage": True}}
    if args.ignore_eos:
        body["ignore_eos"] = True
    body.update(args.extra_body)
    data = json.dumps(body).encode()
    h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if args.api_key:
        h["Authorization"] = "Bearer " + args.api_key
    rec = {"id": req["id"], "input_len": len(req["prompt"]), "max_tokens": req["output_len"], "ok": False}
    t0 = time.perf_counter()
    rec["t_send"] = t0
    st = {"ttft": None, "chunk_times": [], "n_chunks": 0, "usage": None, "finish": None, "done": False}

    async def go():
        reader, writer, status, hd = await http_open(target, "POST", target.path("/v1/completions"), data, h)
        try:
            if status != 200:
                raw = b""
                try:
                    async for p in http_body(reader, hd):
                        raw += p
                        if len(raw) > MAX_ERROR_BODY:
                            break
                except RequestError:
                    pass
                msg = raw[:300].decode("utf-8", "replace")
                try:
                    msg = json.loads(raw)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    pass
                raise RequestError("HTTP %d: %s" % (status, msg.strip()[:300]))
            buf = bytearray()
            async for piece in http_body(reader, hd):
                now = time.perf_counter()
                buf += piece
                if len(buf) > MAX_EVENT:
                    raise RequestError("an SSE event over %d bytes" % MAX_EVENT)
                for payload in sse_events(buf):
                    if st["done"]:
                        raise RequestError("data after [DONE]")
                    if payload.strip() == b"[DONE]":
                        st["done"] = True
                        st["t_done"] = now
                        continue
                    try:
                        ev = json.loads(payload)
                    except ValueError:
                        raise RequestError("malformed SSE data: %r" % payload[:200])
                    if not isinstance(ev, dict):
                        raise RequestError("SSE data not an object: %r" % payload[:200])
                    if "error" in ev:
                        e = ev["error"]
                        raise RequestError("error event: %s" % (e.get("message") if isinstance(e, dict) else e))
                    if isinstance(ev.get("usage"), dict):
                        st["usage"] = ev["usage"]
                    carries, _, finish = chunk_tokens(ev)
                    if carries:
                        st["n_chunks"] += 1
                        st["chunk_times"].append(now)
                        if st["ttft"] is None:
                            st["ttft"] = now - t0
                    if finish is not None:
                        st["finish"] = finish
            if buf.strip():
                raise RequestError("the stream ended inside an SSE event: %r" % bytes(buf[:100]))
        finally:
            writer.close()

    try:
        await asyncio.wait_for(go(), args.timeout)
    except RequestError as e:
        rec["error"] = str(e)
    except asyncio.TimeoutError:
        rec["error"] = "timeout after %g s" % args.timeout
    except Exception as e:  # a failed request never stops the run
        rec["error"] = "%s: %s" % (type(e).__name__, e)
    t_end = time.perf_counter()
    rec["t_end"] = t_end
    rec["e2e"] = t_end - t0
    if "error" not in rec:
        rec["error"] = check_stream(st, req, args, rec)
    rec["ok"] = rec["error"] is None
    if rec["ok"]:
        rec["e2e"] = st["t_done"] - t0
        rec["ttft"] = st["ttft"]
        n = rec["output_tokens"]
        rec["tpot"] = (rec["e2e"] - rec["ttft"]) / (n - 1) if n >= 2 else None
        ct = st["chunk_times"]
        rec["itl"] = [b - a for a, b in zip(ct, ct[1:])]
    else:
        rec["output_tokens"] = rec.get("output_tokens", 0)
    return rec


def check_stream(st, req, args, rec):
    """The reason a complete 200 stream is still a failure, or None."""
    if not st["done"]:
        return "the stream ended without data: [DONE]"
    if st["finish"] is None:
        return "no chunk had a finish_reason"
    if st["ttft"] is None:
        return "no chunk carried a token"
    rec["finish_reason"] = st["finish"]
    rec["chunks"] = st["n_chunks"]
    u = st["usage"]
    if u is not None and isinstance(u.get("completion_tokens"), int):
        rec["output_tokens"] = u["completion_tokens"]
        rec["token_count"] = "usage"
        if isinstance(u.get("prompt_tokens"), int):
            rec["prompt_tokens"] = u["prompt_tokens"]
        n, want = u["completion_tokens"], req["output_len"]
        if args.ignore_eos and n != want:
            return "usage.completion_tokens %d != max_tokens %d (with ignore_eos)" % (n, want)
        if n > want:
            return "usage.completion_tokens %d > max_tokens %d" % (n, want)
    else:
        rec["output_tokens"] = st["n_chunks"]
        rec["token_count"] = "chunks"
    return None


# ---- workload ----

def draw_len(rng, mean, dist, sigma, hi):
    """One length: fixed, or lognormal with this mean and sigma, rounded and clipped to [1, hi]."""
    if dist == "fixed":
        return mean
    mu = math.log(mean) - sigma * sigma / 2  # E[lognormal(mu, sigma)] = exp(mu + sigma^2/2) = mean
    return max(1, min(hi, int(round(rng.lognormvariate(mu, sigma)))))


def make_requests(args, n, seed):
    """n requests: random prompts of exact lengths, their max_tokens and sampling seeds."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        il = draw_len(rng, args.input_len, args.len_dist, args.sigma, args.max_input_len)
        ol = draw_len(rng, args.output_len, args.len_dist, args.sigma, args.max_output_len)
        out.append({"id": i, "prompt": [rng.randrange(args.id_low, args.vocab) for _ in range(il)],
                    "output_len": ol, "seed": rng.randrange(1 << 31)})
    return out


async def closed_loop(target, args, reqs, model, concurrency):
    """concurrency clients, each sending the next request when its last ended."""
    it = iter(reqs)
    recs = []

    async def client():
        for r in it:
            recs.append(await run_one(target, args, r, model))
    await asyncio.gather(*[client() for _ in range(min(concurrency, len(reqs)))])
    return recs


async def open_loop(target, args, reqs, model, rate, max_inflight, seed):
    """Poisson arrivals at rate req/s (inf: all at once), at most max_inflight (0 = no cap) in flight."""
    rng = random.Random(seed)
    sem = asyncio.Semaphore(max_inflight) if max_inflight > 0 else None
    tasks = []
    start = time.perf_counter()
    t_next = 0.0

    async def one(r):
        try:
            return await run_one(target, args, r, model)
        finally:
            if sem:
                sem.release()

    for r in reqs:
        delay = start + t_next - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if sem:
            await sem.acquire()
        tasks.append(asyncio.ensure_future(one(r)))
        if math.isfinite(rate):
            t_next += rng.expovariate(rate)
    return list(await asyncio.gather(*tasks))


# ---- statistics and report ----

def percentile(sorted_xs, p):
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_xs:
        return None
    k = (len(sorted_xs) - 1) * p / 100.0
    f = math.floor(k)
    c = min(f + 1, len(sorted_xs) - 1)
    return sorted_xs[f] + (sorted_xs[c] - sorted_xs[f]) * (k - f)


def stats_ms(xs):
    xs = sorted(x * 1000.0 for x in xs if x is not None)
    if not xs:
        return {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None, "min": None, "max": None}
    return {"n": len(xs), "mean": sum(xs) / len(xs), "p50": percentile(xs, 50), "p90": percentile(xs, 90),
            "p99": percentile(xs, 99), "min": xs[0], "max": xs[-1]}


def summarize(label, recs, keep_requests):
    ok = [r for r in recs if r["ok"]]
    bad = [r for r in recs if not r["ok"]]
    t0 = min((r["t_send"] for r in recs), default=0.0)
    t1 = max((r["t_end"] for r in recs), default=0.0)
    dur = t1 - t0
    out_tok = sum(r["output_tokens"] for r in ok)
    in_tok = sum(r["input_len"] for r in ok)
    reasons = {}
    for r in bad:
        reasons[r["error"]] = reasons.get(r["error"], 0) + 1
    run = dict(label)
    run.update({
        "requests": len(recs), "ok": len(ok), "failed": len(bad),
        "failure_reasons": reasons,
        "duration_s": dur,
        "input_tokens": in_tok, "output_tokens": out_tok,
        "max_tokens_total": sum(r["max_tokens"] for r in ok),
        "token_count_from": sorted({r["token_count"] for r in ok}),
        "output_tok_per_s": out_tok / dur if dur > 0 else 0.0,
        "total_tok_per_s": (out_tok + in_tok) / dur if dur > 0 else 0.0,
        "req_per_s": len(ok) / dur if dur > 0 else 0.0,
        "ttft_ms": stats_ms([r["ttft"] for r in ok]),
        "tpot_ms": stats_ms([r["tpot"] for r in ok]),
        "itl_ms": stats_ms([x for r in ok for x in r["itl"]]),
        "e2e_ms": stats_ms([r["e2e"] for r in ok]),
    })
    if keep_requests:
        run["per_request"] = [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()
                               if k not in ("itl", "t_send", "t_end")} | {"start_s": round(r["t_send"] - t0, 6)}
                              for r in sorted(recs, key=lambda r: r["id"])]
    return run


def fmt(x, w=9, d=1):
    return ("%*.*f" % (w, d, x)) if isinstance(x, (int, float)) else "%*s" % (w, "-")


def print_table(runs, file=sys.stdout):
    hdr = ("%-16s %5s %5s %9s %7s | %9s %9s %9s | %9s %9s %9s | %9s %9s | %9s %9s"
           % ("load", "ok", "fail", "out tok/s", "req/s", "TTFT p50", "p90", "p99", "TPOT p50", "p90", "p99",
              "ITL p50", "p99", "E2E p50", "p99"))
    print(hdr, file=file)
    print("-" * len(hdr), file=file)
    for r in runs:
        load = ("c=%d" % r["concurrency"]) if "concurrency" in r else ("rate=%g" % r["rate"])
        if r.get("phase") == "warmup":
            load += " (warmup)"
        t, p, i, e = r["ttft_ms"], r["tpot_ms"], r["itl_ms"], r["e2e_ms"]
        print("%-16s %5d %5d %s %s | %s %s %s | %s %s %s | %s %s | %s %s"
              % (load, r["ok"], r["failed"], fmt(r["output_tok_per_s"]), fmt(r["req_per_s"], 7, 2),
                 fmt(t["p50"]), fmt(t["p90"]), fmt(t["p99"]), fmt(p["p50"], 9, 2), fmt(p["p90"], 9, 2),
                 fmt(p["p99"], 9, 2), fmt(i["p50"], 9, 2), fmt(i["p99"], 9, 2), fmt(e["p50"]), fmt(e["p99"])),
              file=file)
    print("(times in ms; TTFT/TPOT/ITL/E2E over the ok requests)", file=file)
    for r in runs:
        for reason, n in sorted(r["failure_reasons"].items(), key=lambda kv: -kv[1])[:5]:
            print("  %s: %d failed: %s" % (("c=%d" % r["concurrency"]) if "concurrency" in r
                                            else ("rate=%g" % r["rate"]), n, reason), file=file)


# ---- options ----

def parse_rates(s):
    out = []
    for x in s.split(","):
        v = float(x)
        if not v > 0:
            raise ValueError("rates must be > 0: %r" % x)
        out.append(v)
    if not out:
        raise ValueError("no rates")
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Exit status: 0 every request ok, 1 some failed, 2 bad options.")
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (default %(default)s)")
    ap.add_argument("--model", default=None, help="the request's model (default: the first of GET /v1/models)")
    load = ap.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, help="closed loop: N clients sending back to back")
    load.add_argument("--rate", type=float, help="open loop: Poisson arrivals, requests/s (inf = all at once)")
    ap.add_argument("--max-inflight", type=int, default=0, help="open loop: cap on requests in flight (0 = none)")
    ap.add_argument("--rates", type=parse_rates, help="comma-separated rates run in turn (open loop)")
    ap.add_argument("--sla-ttft-ms", type=float, help="find the largest rate whose P99 TTFT stays under this")
    ap.add_argument("--sweep-all", action="store_true", help="with --rates and --sla-ttft-ms: run every rate "
                    "(default: stop at the first that misses the SLA)")
    ap.add_argument("--max-rate", type=float, default=256.0, help="SLA search: highest rate tried (default 256)")
    ap.add_argument("--search-steps", type=int, default=3, help="SLA search: bisection steps after doubling")
    ap.add_argument("--requests", type=int, default=64, help="requests measured per run (default 64)")
    ap.add_argument("--warmup", type=int, default=0, help="requests sent first and not measured (default 0)")
    ap.add_argument("--input-len", type=int, default=128, help="prompt tokens (mean with lognormal)")
    ap.add_argument("--output-len", type=int, default=128, help="max_tokens (mean with lognormal)")
    ap.add_argument("--len-dist", choices=("fixed", "lognormal"), default="fixed")
    ap.add_argument("--sigma", type=float, default=0.5, help="lognormal sigma (default 0.5)")
    ap.add_argument("--max-input-len", type=int, help="lognormal clip (default 4 x --input-len)")
    ap.add_argument("--max-output-len", type=int, help="lognormal clip (default 4 x --output-len)")
    ap.add_argument("--vocab", type=int, default=32000, help="prompt ids are < this (default 32000)")
    ap.add_argument("--id-low", type=int, default=100, help="prompt ids are >= this, clear of special ids "
                    "(default 100)")
    ap.add_argument("--seed", type=int, default=0, help="prompts, lengths and arrivals (default 0)")
    ie = ap.add_mutually_exclusive_group()
    ie.add_argument("--ignore-eos", dest="ignore_eos", action="store_true", default=True,
                    help="send ignore_eos (the default): every request makes exactly max_tokens")
    ie.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--extra-body", type=json.loads, default={},
                    help='JSON object merged into every request (e.g. \'{"cache_prompt": false}\')')
    ap.add_argument("--api-key", default=None, help="sent as Authorization: Bearer KEY")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per request, whole stream (default 300)")
    ap.add_argument("--json", metavar="FILE", help="write settings and results as JSON")
    ap.add_argument("--per-request", action="store_true", help="keep every request's record in the JSON")
    ap.add_argument("--quiet", action="store_true", help="no table on stdout")
    a = ap.parse_args(argv)
    err = []
    if a.concurrency is not None and a.concurrency < 1:
        err.append("--concurrency must be >= 1")
    if a.rate is not None and not a.rate > 0:
        err.append("--rate must be > 0")
    if a.sla_ttft_ms is not None and not a.sla_ttft_ms > 0:
        err.append("--sla-ttft-ms must be > 0")
    if (a.sla_ttft_ms is not None or a.rates) and a.concurrency is not None:
        err.append("--rates and --sla-ttft-ms are open-loop: not with --concurrency")
    if a.rates and a.rate is not None:
        err.append("give --rate or --rates, not both")
    if a.concurrency is None and a.rate is None and not a.rates and a.sla_ttft_ms is None:
        a.concurrency = 1
    for name in ("requests", "input_len", "output_len", "vocab", "search_steps"):
        if getattr(a, name) < (0 if name == "search_steps" else 1):
            err.append("--%s must be >= 1" % name.replace("_", "-"))
    if a.warmup < 0 or a.max_inflight < 0:
        err.append("--warmup and --max-inflight must be >= 0")
    if not 0 <= a.id_low < a.vocab:
        err.append("need 0 <= --id-low < --vocab")
    if a.timeout <= 0 or a.sigma <= 0 or a.temperature < 0 or not a.max_rate > 0:
        err.append("--timeout, --sigma and --max-rate must be > 0, --temperature >= 0")
    if not isinstance(a.extra_body, dict):
        err.append("--extra-body must be a JSON object")
    a.max_input_len = a.max_input_len or 4 * a.input_len
    a.max_output_len = a.max_output_len or 4 * a.output_len
    if a.max_input_len < 1 or a.max_output_len < 1:
        err.append("--max-input-len and --max-output-len must be >= 1")
    try:
        a.target = Target(a.url)
    except ValueError as e:
        err.append(str(e))
    if err:
        ap.error("; ".join(err))
    return a


# ---- main ----

async def main_async(a):
    target = a.target
    model = a.model
    if model is None:
        try:
            model = (await http_get_json(target, "/v1/models", a.api_key, min(a.timeout, 30)))["data"][0]["id"]
        except Exception as e:  # requests will then fail and say why
            print("serve_load: GET /v1/models failed (%s); using model \"default\"" % e, file=sys.stderr)
            model = "default"
    runs = []
    seed_base = a.seed * 1000003

    async def run(label, n, seed):
        reqs = make_requests(a, n, seed)
        if "concurrency" in label:
            recs = await closed_loop(target, a, reqs, model, label["concurrency"])
        else:
            recs = await open_loop(target, a, reqs, model, label["rate"], a.max_inflight, seed + 1)
        r = summarize(label, recs, a.per_request)
        runs.append(r)
        if not a.quiet:
            print("serve_load: %s: %d ok, %d failed, %.1f s" % (
                ", ".join("%s=%s" % kv for kv in label.items()), r["ok"], r["failed"], r["duration_s"]),
                file=sys.stderr)
        return r

    if a.warmup:
        wl = {"phase": "warmup"}
        wl.update({"concurrency": a.concurrency} if a.concurrency else {"concurrency": max(1, a.max_inflight or 8)})
        await run(wl, a.warmup, seed_base + 7)

    sla = None
    if a.concurrency is not None:
        await run({"phase": "measure", "concurrency": a.concurrency}, a.requests, seed_base)
    elif a.sla_ttft_ms is None:
        for k, rate in enumerate(a.rates or [a.rate]):
            await run({"phase": "measure", "rate": rate}, a.requests, seed_base + 10 * k)
    else:
        sla = await sla_search(a, run, seed_base)
    return model, runs, sla


def meets(r, sla_ms):
    return r["failed"] == 0 and r["ok"] > 0 and r["ttft_ms"]["p99"] is not None and r["ttft_ms"]["p99"] < sla_ms


async def sla_search(a, run, seed_base):
    """Rates in turn (--rates), or doubling then bisection; the largest rate that meets the SLA."""
    tried = []

    async def at(rate):
        r = await run({"phase": "measure", "rate": rate}, a.requests, seed_base + 10 * len(tried))
        tried.append({"rate": rate, "ttft_p99_ms": r["ttft_ms"]["p99"], "failed": r["failed"],
                      "meets": meets(r, a.sla_ttft_ms)})
        return tried[-1]["meets"]

    best = None
    if a.rates:
        for rate in a.rates:
            if await at(rate):
                best = rate if best is None else max(best, rate)
            elif not a.sweep_all:
                break
    else:
        lo, hi = None, None
        rate = a.rate or 1.0
        while rate <= a.max_rate:
            if await at(rate):
                lo = rate
                rate *= 2
            else:
                hi = rate
                break
        if lo is not None and hi is not None:
            for _ in range(a.search_steps):
                mid = (lo + hi) / 2
                if await at(mid):
                    lo = mid
                else:
                    hi = mid
        best = lo
    return {"sla_ttft_p99_ms": a.sla_ttft_ms, "best_rate": best, "tried": tried}


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    t_start = time.time()
    model, runs, sla = asyncio.run(main_async(a))
    settings = {k: v for k, v in vars(a).items() if k not in ("target", "json", "quiet")}
    settings["model"] = model
    result = {"tool": "serve_load.py", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
              "settings": settings, "runs": runs}
    if sla is not None:
        result["sla"] = sla
    measured = [r for r in runs if r.get("phase") == "measure"]
    result["all_ok"] = all(r["failed"] == 0 for r in runs)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    if not a.quiet:
        print_table(runs)
        if sla is not None:
            print("SLA P99 TTFT < %g ms: best rate %s req/s (tried %s)" % (
                a.sla_ttft_ms, sla["best_rate"], ", ".join("%g%s" % (t["rate"], "" if t["meets"] else " (miss)")
                                                          for t in sla["tried"])))
    if not measured:
        return 1
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

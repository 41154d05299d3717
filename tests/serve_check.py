"""serve_check.py — the checks of tests/cli_serve.sh against `kiln serve`.

usage: python3 tests/serve_check.py KILN TMPDIR   (TMPDIR holds kjv.kiln and chat.kiln)
Standard library only; the `openai` part runs when that package imports.
Prints FAIL lines and "N passed, M failed"; exits non-zero on a failure.
"""
import http.client, json, os, re, signal, socket, subprocess, sys, threading, time

KILN, T = sys.argv[1], sys.argv[2]
DEVICE = os.environ.get("KILN_TEST_DEVICE", "cpu")  # gpu: bench/gpu_serve_smoke.sh runs these checks on a GPU
# the queue checks run on kiln-run (the runtime-only tool) when it is built beside kiln
KILN_RUN = os.path.join(os.path.dirname(os.path.abspath(KILN)), "kiln-run")
passed = failed = 0
procs = []


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what, file=sys.stderr)
    return cond


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, engine, *args, exe=None):
        self.port = free_port()
        self.log = open(os.path.join(T, "serve-%d.log" % self.port), "w+")
        self.p = subprocess.Popen([exe or KILN, "serve", engine, "--device", DEVICE, "--host", "127.0.0.1",
                                   "--port", str(self.port), *args], stdout=self.log, stderr=self.log)
        open(os.path.join(T, "%d.pid" % self.p.pid), "w").write(str(self.p.pid))
        procs.append(self.p)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.p.poll() is not None:
                break
            try:
                if self.req("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server did not become ready: " + self.logtext())

    def logtext(self):
        self.log.seek(0)
        return self.log.read()

    def req(self, method, path, body=None, headers=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        c.request(method, path, body=data, headers=headers or {})
        r = c.getresponse()
        raw = r.read()
        c.close()
        return r.status, raw, dict(r.getheaders())

    def post(self, path, body, key=None, timeout=120):
        h = {"Content-Type": "application/json"}
        if key:
            h["Authorization"] = "Bearer " + key
        st, raw, hd = self.req("POST", path, body, h, timeout)
        try:
            return st, json.loads(raw), hd
        except ValueError:
            return st, raw, hd

    def stop(self, timeout=60):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return -9


def sse(raw):
    """The data payloads of an SSE body: (list of JSON chunks, saw [DONE])."""
    chunks, done = [], False
    for ev in raw.decode().split("\n\n"):
        if not ev.strip():
            continue
        assert ev.startswith("data: "), ev
        d = ev[6:]
        if d == "[DONE]":
            done = True
        else:
            chunks.append(json.loads(d))
    return chunks, done


def kiln_run(engine, prompt, n, chat=False, extra=()):
    cmd = [KILN, "run", engine, "--prompt", prompt, "--max-tokens", str(n), "--device", DEVICE, "--json"] + \
          (["--chat"] if chat else []) + (list(extra) if extra else ["--temperature", "0"])
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout)


def stream_text(chunks, chat=False):
    if chat:
        return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


def metrics(s):
    st, raw, hd = s.req("GET", "/metrics")
    check(st == 200, "/metrics status %d" % st)
    vals = {}
    line_re = re.compile(r'^(kiln_[a-zA-Z0-9_]+)(\{[a-zA-Z_]+="[^"]*"(,[a-zA-Z_]+="[^"]*")*\})? (-?[0-9.e+-]+|\+Inf|NaN)$')
    bad = []
    for line in raw.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        m = line_re.match(line)
        if not m:
            bad.append(line)
            continue
        vals[m.group(1) + (m.group(2) or "")] = float(m.group(4))
    check(not bad, "/metrics lines not in Prometheus text format: %r" % bad[:3])
    return vals


P = "In the beginning"
N = 16
KEY = "sekrit"


def check_completions(s):
    want = kiln_run(os.path.join(T, "chat.kiln"), P, N)
    st, r, _ = s.post("/v1/completions", {"model": "kjv", "prompt": P, "max_tokens": N, "temperature": 0}, KEY)
    check(st == 200, "completion status %d %r" % (st, r))
    check(r["choices"][0]["text"] == want["text"], "completion text %r != kiln run %r" % (r["choices"][0]["text"], want["text"]))
    u = r["usage"]
    check(u == {"prompt_tokens": len(want["prompt_ids"]), "completion_tokens": len(want["ids"]),
                "total_tokens": len(want["prompt_ids"]) + len(want["ids"])}, "usage %r" % u)
    check(r["choices"][0]["finish_reason"] == ("length" if len(want["ids"]) == N else "stop"), "finish_reason")
    st, raw, hd = s.req("POST", "/v1/completions", json.dumps({"model": "kjv", "prompt": P, "max_tokens": N,
                        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}),
                        {"Authorization": "Bearer " + KEY})
    chunks, done = sse(raw)
    check(st == 200 and done and "text/event-stream" in hd.get("Content-Type", ""), "stream status/[DONE]/type")
    check(stream_text(chunks) == want["text"], "streamed text %r != %r" % (stream_text(chunks), want["text"]))
    check(chunks[-1]["choices"] == [] and chunks[-1]["usage"] == u, "stream usage chunk %r" % chunks[-1])
    check(chunks[-2]["choices"][0]["finish_reason"] == r["choices"][0]["finish_reason"], "stream finish_reason")
    # the tokens' texts, for stop strings across token boundaries (stream chunks may merge tokens)
    st, r, _ = s.post("/v1/completions", {"model": "kjv", "prompt": P, "max_tokens": N, "temperature": 0,
                                          "logprobs": 0}, KEY)
    return want, r["choices"][0]["logprobs"]["tokens"] if st == 200 else []


def check_stop(s, want, pieces):
    # a stop string made of the end of one token's text and the start of the next
    stop = None
    for a, b in zip(pieces[2:], pieces[3:]):
        if len(a) >= 2 and len(b) >= 2:
            stop = a[-2:] + b[:2]
            break
    if not check(stop is not None, "no token boundary to put a stop string on: %r" % pieces):
        return
    text = want["text"]
    expect = text[:text.find(stop)]
    for stream in (False, True):
        body = {"model": "kjv", "prompt": P, "max_tokens": N, "temperature": 0, "stop": ["zzzz", stop], "stream": stream}
        if stream:
            st, raw, _ = s.req("POST", "/v1/completions", json.dumps(body), {"Authorization": "Bearer " + KEY})
            chunks, _ = sse(raw)
            got, fin = stream_text(chunks), chunks[-1]["choices"][0]["finish_reason"]
        else:
            st, r, _ = s.post("/v1/completions", body, KEY)
            got, fin = r["choices"][0]["text"], r["choices"][0]["finish_reason"]
        check(st == 200 and got == expect and fin == "stop",
              "stop %r (stream %s): got %r %r, want %r" % (stop, stream, got, fin, expect))


def check_chat(s):
    msg = "Who made the light?"
    want = kiln_run(os.path.join(T, "chat.kiln"), msg, N, chat=True)
    body = {"model": "kjv", "messages": [{"role": "user", "content": msg}], "max_tokens": N, "temperature": 0}
    st, r, _ = s.post("/v1/chat/completions", body, KEY)
    check(st == 200 and r["object"] == "chat.completion", "chat status %d %r" % (st, r))
    check(r["choices"][0]["message"] == {"role": "assistant", "content": want["text"]}, "chat text %r != %r" % (r["choices"][0]["message"], want["text"]))
    check(r["usage"]["prompt_tokens"] == len(want["prompt_ids"]), "chat prompt_tokens")
    body["stream"] = True
    st, raw, _ = s.req("POST", "/v1/chat/completions", json.dumps(body), {"Authorization": "Bearer " + KEY})
    chunks, done = sse(raw)
    check(done and chunks[0]["choices"][0]["delta"].get("role") == "assistant", "chat stream role")
    check(stream_text(chunks, True) == want["text"], "chat stream text")
    return want


def check_errors(s):
    st, r, _ = s.post("/v1/completions", b"{not json", KEY)
    check(st == 400 and r["error"]["type"] == "invalid_request_error", "malformed JSON: %d %r" % (st, r))
    st, r, _ = s.post("/v1/completions", {"model": "kjv", "prompt": P, "suffix": "x"}, KEY)
    check(st == 400 and r["error"]["param"] == "suffix" and r["error"]["code"] == "unsupported_parameter",
          "unsupported field: %d %r" % (st, r))
    st, r, _ = s.post("/v1/chat/completions", {"model": "kjv", "messages": [{"role": "user", "content": "x"}],
                                                "echo": True}, KEY)
    check(st == 400 and r["error"]["param"] == "echo", "chat echo: %d %r" % (st, r))
    st, r, _ = s.post("/v1/completions", {"model": "kjv", "prompt": P, "echo": "yes"}, KEY)
    check(st == 400 and r["error"]["param"] == "echo", "echo not a boolean: %d %r" % (st, r))
    for body, param in (({"n": 17}, "n"), ({"n": 2, "best_of": 3}, "best_of"), ({"min_p": 2}, "min_p"),
                        ({"presence_penalty": 2.5}, "presence_penalty"), ({"repetition_penalty": 0}, "repetition_penalty"),
                        ({"logprobs": 21}, "logprobs"), ({"logprobs": True}, "logprobs"), ({"top_logprobs": 2}, "top_logprobs")):
        st, r, _ = s.post("/v1/completions", dict({"model": "kjv", "prompt": P}, **body), KEY)
        check(st == 400 and r["error"]["param"] == param, "%r: %d %r" % (body, st, r))
    st, r, _ = s.post("/v1/chat/completions", {"model": "kjv", "messages": [{"role": "user", "content": "x"}],
                                                "top_logprobs": 2}, KEY)
    check(st == 400 and r["error"]["param"] == "top_logprobs", "chat top_logprobs without logprobs: %d %r" % (st, r))
    st, r, _ = s.post("/v1/completions", {"model": "kjv", "prompt": P, "stop": ["\u0000"]}, KEY)
    check(st == 400, "a NUL stop string: %d %r" % (st, r))  # jansson refuses \u0000 itself; the parser too
    st, r, _ = s.post("/v1/completions", {"model": "kjv", "prompt": P, "max_tokens": 1, "user": "x"}, KEY)
    check(st == 200, "a harmless unknown field is ignored: %d" % st)
    st, r, _ = s.post("/v1/completions", {"model": "kjv", "prompt": [5] * 600, "max_tokens": 1}, KEY)
    check(st == 400 and r["error"]["code"] == "context_length_exceeded", "over the context: %d %r" % (st, r))
    st, r, _ = s.post("/v1/completions", {"model": "kjv", "prompt": "and the " * 400, "max_tokens": 1}, KEY)
    check(st == 400 and r["error"]["code"] == "context_length_exceeded", "text over the context: %d %r" % (st, r))
    st, r, _ = s.post("/v1/completions", {"model": "kjv", "prompt": P}, "wrong")
    check(st == 401 and "error" in r, "wrong key: %d" % st)
    st, r, _ = s.post("/v1/completions", {"model": "kjv", "prompt": P})
    check(st == 401, "missing key: %d" % st)
    st, r, _ = s.post("/v1/completions", {"model": "gpt-4", "prompt": P}, KEY)
    check(st == 404 and r["error"]["code"] == "model_not_found", "unknown model: %d %r" % (st, r))
    st, _, _ = s.req("GET", "/v1/nothing")
    check(st == 404, "unknown path: %d" % st)
    st, _, _ = s.req("GET", "/v1/completions")
    check(st == 405, "GET on completions: %d" % st)
    st, r, _ = s.post("/v1/completions", b" " * (17 << 20), KEY)
    check(st == 413, "17 MiB body: %d" % st)


def check_misc(s):
    st, raw, _ = s.req("GET", "/v1/models", headers={"Authorization": "Bearer " + KEY})
    check(st == 200 and json.loads(raw)["data"][0]["id"] == "kjv", "/v1/models %d %r" % (st, raw[:200]))
    st, r, _ = s.post("/tokenize", {"prompt": P}, KEY)
    check(st == 200 and r["count"] == len(r["tokens"]) > 0, "/tokenize %d %r" % (st, r))
    st, d, _ = s.post("/detokenize", {"tokens": r["tokens"]}, KEY)
    check(st == 200 and P in d["prompt"], "/detokenize %d %r" % (st, d))
    m = metrics(s)
    check(m.get("kiln_requests_running") == 0 and m.get("kiln_generation_tokens_total", 0) > 0, "metrics values %r" % m)
    check(m.get('kiln_time_to_first_token_seconds_bucket{le="+Inf"}', 0) >= 1, "ttft histogram")


def check_disconnect(s):
    before = metrics(s).get('kiln_requests_finished_total{finish_reason="cancelled"}', 0)
    c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
    body = json.dumps({"model": "kjv", "prompt": P, "max_tokens": 400, "ignore_eos": True, "stream": True})
    c.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n%s" % (KEY, len(body), body)).encode())
    c.recv(100)  # the stream has started
    c.close()
    t0 = time.time()
    after = before
    while time.time() - t0 < 10 and after == before:
        time.sleep(0.1)
        after = metrics(s).get('kiln_requests_finished_total{finish_reason="cancelled"}', 0)
    check(after == before + 1, "a disconnected stream is cancelled (cancelled %s -> %s)" % (before, after))
    t0 = time.time()
    st, r, _ = s.post("/v1/completions", {"model": "kjv", "prompt": P, "max_tokens": 2}, KEY, timeout=30)
    check(st == 200 and time.time() - t0 < 5, "a request after the disconnect is served promptly")


def check_sampling_features(s):
    """n, penalties, min_p and logprobs: the server against `kiln run` with the same options and seed."""
    eng = os.path.join(T, "chat.kiln")
    base = {"model": "kjv", "prompt": P, "max_tokens": 24, "ignore_eos": True}
    # penalties (greedy): the text of kiln run with the same flags, and not plain greedy's
    greedy = kiln_run(eng, P, 24)["text"]
    pen = kiln_run(eng, P, 24, extra=["--temperature", "0", "--presence-penalty", "1", "--frequency-penalty", "0.5",
                                      "--repetition-penalty", "1.3"])
    st, r, _ = s.post("/v1/completions", dict(base, temperature=0, presence_penalty=1, frequency_penalty=0.5,
                                               repetition_penalty=1.3), KEY)
    check(st == 200 and r["choices"][0]["text"] == pen["text"], "penalties: %r vs kiln run %r" % (r, pen["text"]))
    check(pen["text"] != greedy, "penalties change nothing: %r" % greedy)
    # sampling with min_p and a seed: kiln run's text; n=3 gives seeds S, S+1, S+2
    flags = ["--temperature", "1.2", "--top-p", "0.95", "--min-p", "0.05", "--seed", "41"]
    runs = [kiln_run(eng, P, 24, extra=flags[:-1] + [str(41 + i)])["text"] for i in range(3)]
    st, r, _ = s.post("/v1/completions", dict(base, temperature=1.2, top_p=0.95, min_p=0.05, seed=41, n=3), KEY)
    got = [c["text"] for c in sorted(r.get("choices", []), key=lambda c: c["index"])] if st == 200 else r
    if DEVICE == "cpu":
        check(got == runs, "n=3 sampled choices %r vs kiln run with seeds 41..43 %r" % (got, runs))
    else:  # a GPU batch's logits may differ in the last bits from a request's alone (docs/c-api.md)
        same = [len(os.path.commonprefix([a, b])) for a, b in zip(got, runs)]
        print("n=3 on %s: common prefix with kiln run alone, in characters: %s" % (DEVICE, same))
        check(st == 200 and len(got) == 3, "n=3 choices %r" % got)
        runs = got  # the streamed request below has the same batch, so the same texts
    check(len(set(runs)) > 1, "three seeds gave one text")
    check(st == 200 and r["usage"]["completion_tokens"] == 72 and r["usage"]["prompt_tokens"] > 0, "n=3 usage %r" % r.get("usage"))
    # the same streamed: chunks carry their choice's index
    st, raw, _ = s.req("POST", "/v1/completions", json.dumps(dict(base, temperature=1.2, top_p=0.95, min_p=0.05,
                       seed=41, n=3, stream=True, stream_options={"include_usage": True})), {"Authorization": "Bearer " + KEY})
    chunks, done = sse(raw)
    texts = ["", "", ""]
    fins = [None] * 3
    for c in chunks:
        for ch in c["choices"]:
            texts[ch["index"]] += ch["text"]
            fins[ch["index"]] = ch["finish_reason"] or fins[ch["index"]]
    check(done and texts == runs and fins == ["length"] * 3, "n=3 streamed %r %r" % (texts, fins))
    check(chunks and chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 72, "n=3 stream usage")
    # logprobs (completions): greedy, so each token is its own top alternative
    st, r, _ = s.post("/v1/completions", dict(base, temperature=0, logprobs=3), KEY)
    lp = r["choices"][0]["logprobs"] if st == 200 else None
    ok = lp is not None and len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 24
    check(ok, "completions logprobs shape %r" % lp)
    if ok:
        check(all(x <= 0 for x in lp["token_logprobs"]), "logprobs <= 0")
        check(all(len(t) <= 3 and abs(max(t.values()) - x) < 1e-6 for t, x in zip(lp["top_logprobs"], lp["token_logprobs"])),
              "greedy token is the most likely: %r" % lp["top_logprobs"][:3])
        check("".join(lp["tokens"]) == r["choices"][0]["text"] == greedy, "tokens join to the text: %r" % lp["tokens"])
        check(lp["text_offset"] == [sum(len(t.encode()) for t in lp["tokens"][:i]) for i in range(24)], "text_offset")
    # echo: the prompt's text before the completion's; with logprobs its tokens' entries first (the first
    # null), the numbers of `kiln run --prompt-logprobs` over the same prompt; max_tokens 0 scores it alone
    prun = json.loads(subprocess.run([KILN, "run", eng, "--prompt", P, "--max-tokens", "0", "--prompt-logprobs", "2",
                                      "--device", DEVICE, "--json"], capture_output=True, text=True, timeout=120,
                                     check=True).stdout)
    want_lp = [None] + [e["logprob"] for e in prun["prompt_logprobs"][1:]]
    n_p = len(prun["prompt_ids"])
    st, r, _ = s.post("/v1/completions", dict(base, max_tokens=0, echo=True, logprobs=2, temperature=0), KEY)
    lp = r["choices"][0]["logprobs"] if st == 200 else None
    check(st == 200 and r["choices"][0]["text"] == P and r["usage"]["completion_tokens"] == 0 and
          r["choices"][0]["finish_reason"] == "length", "echo, max_tokens 0: %r" % r)
    ok = lp is not None and len(lp["tokens"]) == n_p and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    check(ok, "echo logprobs shape %r" % lp)
    if ok:
        tol = 1e-5 if DEVICE == "cpu" else 2e-2
        check(all(abs(a - b) <= tol for a, b in zip(lp["token_logprobs"][1:], want_lp[1:])),
              "echo logprobs %r vs kiln run --prompt-logprobs %r" % (lp["token_logprobs"], want_lp))
        check(all(len(t) == 2 and max(t.values()) >= x for t, x in zip(lp["top_logprobs"][1:], lp["token_logprobs"][1:])),
              "echo top_logprobs %r" % lp["top_logprobs"])
    st, r, _ = s.post("/v1/completions", dict(base, max_tokens=6, echo=True, logprobs=0, temperature=0), KEY)
    lp = r["choices"][0]["logprobs"] if st == 200 else None
    want6 = kiln_run(eng, P, 6, extra=["--temperature", "0", "--ignore-eos"])["text"]
    check(st == 200 and r["choices"][0]["text"] == P + want6 and lp is not None and len(lp["tokens"]) == n_p + 6 and
          lp["text_offset"] == [sum(len(t.encode()) for t in lp["tokens"][:i]) for i in range(n_p + 6)],
          "echo with 6 tokens: %r, want %r" % (r, P + want6))
    st, r, _ = s.post("/v1/completions", dict(base, max_tokens=0, echo=True), KEY)
    check(st == 200 and r["choices"][0]["text"] == P and r["choices"][0]["logprobs"] is None, "echo alone: %r" % r)
    # echo streamed: the same text and log-probabilities as not streamed, the prompt's text and its
    # tokens' entries in the first chunk (with the first generated token's), and alone at max_tokens 0
    for mt, lp in ((6, 0), (0, 2), (5, None)):
        b = dict(base, max_tokens=mt, echo=True, temperature=0)
        if lp is not None:
            b["logprobs"] = lp
        st, whole, _ = s.post("/v1/completions", b, KEY)
        st2, raw, _ = s.req("POST", "/v1/completions", json.dumps(dict(b, stream=True)), {"Authorization": "Bearer " + KEY})
        chunks, done = sse(raw)
        text = stream_text(chunks)
        first = next((c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["text"]), None)
        toks = [t for c in chunks if c["choices"] and c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["tokens"]]
        lps = [x for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
               for x in c["choices"][0]["logprobs"]["token_logprobs"]]
        wl = whole["choices"][0]["logprobs"] if st == 200 else None
        check(st == 200 and st2 == 200 and done and text == whole["choices"][0]["text"] and text.startswith(P) and
              first is not None and first["text"].startswith(P) and
              (lp is None or (toks == wl["tokens"] and lps == wl["token_logprobs"] and
                              len(first["logprobs"]["tokens"]) >= n_p)) and
              (lp is not None or all(c["choices"][0]["logprobs"] is None for c in chunks if c["choices"])),
              "echo streamed (max_tokens %d, logprobs %r): %r vs %r" % (mt, lp, chunks[:2], whole))
    # logprobs (chat), streamed and not: the same numbers
    msgs = [{"role": "user", "content": "Who made the light?"}]
    cb = {"model": "kjv", "messages": msgs, "max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    st, r, _ = s.post("/v1/chat/completions", cb, KEY)
    content = r["choices"][0]["logprobs"]["content"] if st == 200 else []
    check(len(content) == r.get("usage", {}).get("completion_tokens", -1) and
          all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"] and
              bytes(e["bytes"]).decode("utf-8", "replace") is not None for e in content), "chat logprobs %r" % content[:2])
    st, raw, _ = s.req("POST", "/v1/chat/completions", json.dumps(dict(cb, stream=True)), {"Authorization": "Bearer " + KEY})
    chunks, done = sse(raw)
    streamed = [e for c in chunks for ch in c["choices"] if ch.get("logprobs") for e in ch["logprobs"]["content"]]
    check(done and [(e["token"], e["logprob"]) for e in streamed] == [(e["token"], e["logprob"]) for e in content],
          "chat logprobs streamed = not streamed")
    m = metrics(s)
    check(m.get("kiln_time_per_output_token_seconds_count", 0) > 0 and m.get("kiln_request_queue_time_seconds_count", 0) > 0
          and "kiln_kv_cache_usage_ratio" in m and "kiln_preemptions_total" in m, "new metrics %r" % m)


def check_preemption():
    """A KV memory for about two requests and four slots: requests are preempted and resumed, and each
    still gives exactly kiln run's text."""
    # bytes per KV token on this device: from the capacity a 4 MiB KV memory gives
    s = Server(os.path.join(T, "kjv.kiln"), "--max-batch", "4", "--kv-memory", str(4 << 20), "--max-context", "256")
    cap = metrics(s).get("kiln_kv_cache_capacity_tokens", 0)
    check(s.stop() == 0 and cap > 0, "KV capacity %r" % cap)
    per_token = (4 << 20) / max(cap, 1)
    s = Server(os.path.join(T, "kjv.kiln"), "--max-batch", "4", "--kv-memory", str(int(per_token * 420)),
               "--max-context", "256")
    try:
        prompts = ["In the beginning", "And God said", "The LORD is my", "Blessed are the"]
        want = {p: kiln_run(os.path.join(T, "kjv.kiln"), p, 180, extra=["--temperature", "0", "--ignore-eos"])["text"]
                for p in prompts}
        out = {}

        def one(p):
            out[p] = s.post("/v1/completions", {"model": "kjv", "prompt": p, "max_tokens": 180, "temperature": 0,
                                                "ignore_eos": True})
        ths = [threading.Thread(target=one, args=(p,)) for p in prompts]
        for t in ths:
            t.start()
        for t in ths:
            t.join(300)
        for p in prompts:
            st, r, _ = out.get(p, (0, None, None))
            if DEVICE == "cpu":
                check(st == 200 and r["choices"][0]["text"] == want[p], "preempted %r: %d %r" % (p, st, r))
            else:  # recomputed and batched logits may differ in the last bits (docs/c-api.md)
                ok = st == 200 and r["usage"]["completion_tokens"] == 180
                check(ok, "preempted %r: %d %r" % (p, st, r))
                if ok:
                    print("preempted %r on %s: %d of %d characters agree with kiln run alone" % (
                        p, DEVICE, len(os.path.commonprefix([r["choices"][0]["text"], want[p]])), len(want[p])))
        m = metrics(s)
        check(m.get("kiln_preemptions_total", 0) >= 1 and m.get("kiln_recomputed_tokens_total", 0) > 0,
              "no preemption happened: %r" % {k: v for k, v in m.items() if "preempt" in k or "recomputed" in k})
    finally:
        check(s.stop() == 0, "preemption server exit status")


def check_openai(s, want, want_chat):
    try:
        import openai
    except ImportError:
        print("SKIP: the openai package is not installed (pip install failed): client checks skipped")
        return
    cl = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % s.port, api_key=KEY, max_retries=0, timeout=120)
    r = cl.completions.create(model="kjv", prompt=P, max_tokens=N, temperature=0)
    check(r.choices[0].text == want["text"] and r.usage.completion_tokens == len(want["ids"]), "openai completions")
    text = "".join(c.choices[0].text for c in cl.completions.create(model="kjv", prompt=P, max_tokens=N, temperature=0,
                                                                   stream=True) if c.choices)
    check(text == want["text"], "openai completions stream")
    msgs = [{"role": "user", "content": "Who made the light?"}]
    r = cl.chat.completions.create(model="kjv", messages=msgs, max_tokens=N, temperature=0)
    check(r.choices[0].message.content == want_chat["text"], "openai chat")
    text = "".join(c.choices[0].delta.content or "" for c in cl.chat.completions.create(
        model="kjv", messages=msgs, max_tokens=N, temperature=0, stream=True) if c.choices)
    check(text == want_chat["text"], "openai chat stream")
    try:
        cl.completions.create(model="nope", prompt=P, max_tokens=1)
        check(False, "openai: unknown model raised nothing")
    except openai.NotFoundError:
        check(True, "")


def check_drain(s):
    if DEVICE != "cpu":  # a GPU finishes the 300 tokens before the drain can be observed
        check(s.stop() == 0, "exit status after SIGTERM")
        return
    res = {}

    def long_request():
        res["r"] = s.post("/v1/completions", {"model": "kjv", "prompt": P, "max_tokens": 300, "ignore_eos": True}, KEY)

    th = threading.Thread(target=long_request)
    th.start()
    t0 = time.time()
    while time.time() - t0 < 20 and metrics(s).get("kiln_requests_running") != 1:
        time.sleep(0.05)
    s.p.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    try:
        st, _, _ = s.req("GET", "/health", timeout=5)
        st2, r2, _ = s.post("/v1/completions", {"model": "kjv", "prompt": P, "max_tokens": 1}, KEY, timeout=5)
        check(st == 503 and st2 == 503, "while draining: /health %d, a new request %d (want 503)" % (st, st2))
    except OSError as e:
        check(False, "while draining the server did not answer: %s" % e)
    th.join(120)
    st, r, _ = res.get("r", (0, None, None))
    check(st == 200 and r["usage"]["completion_tokens"] == 300, "the running request finished during the drain: %d" % st)
    rc = s.p.wait(60)
    check(rc == 0, "exit status after SIGTERM: %s" % rc)


def check_queue():
    exe = KILN_RUN if os.access(KILN_RUN, os.X_OK) else KILN
    s = Server(os.path.join(T, "kjv.kiln"), "--max-batch", "1", "--max-queue", "1", "--drain-seconds", "0",
               exe=exe)
    try:
        st, r, _ = s.post("/v1/chat/completions", {"model": "kjv", "messages": [{"role": "user", "content": "hi"}]})
        check(st == 400 and "chat template" in r["error"]["message"], "chat without a template: %d %r" % (st, r))
        out = []

        def one():
            st, r, hd = s.post("/v1/completions", {"model": "kjv", "prompt": P, "max_tokens": 100, "ignore_eos": True})
            out.append((st, hd.get("Retry-After")))

        ths = [threading.Thread(target=one) for _ in range(5)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(300)
        codes = sorted(c for c, _ in out)
        check(codes.count(429) >= 1 and codes.count(200) >= 2, "queue full: codes %r" % codes)
        check(all(ra == "1" for c, ra in out if c == 429), "429 without Retry-After")
        check(metrics(s).get("kiln_requests_rejected_total", 0) == codes.count(429), "rejected metric")
        # --drain-seconds 0: SIGTERM cancels what is still running, answers it 503, exits 0
        if DEVICE != "cpu":  # too fast on a GPU to catch a request running
            return
        res = {}
        th = threading.Thread(target=lambda: res.update(r=s.post("/v1/completions", {
            "model": "kjv", "prompt": P, "max_tokens": 400, "ignore_eos": True})))
        th.start()
        t0 = time.time()
        while time.time() - t0 < 20 and metrics(s).get("kiln_requests_running") != 1:
            time.sleep(0.05)
        s.p.send_signal(signal.SIGTERM)
        th.join(60)
        st = res.get("r", (0,))[0]
        check(st == 503, "a request cancelled by the drain deadline gets 503: %d" % st)
    finally:
        check(s.stop() == 0, "queue server exit status")


def check_usage():
    def rc_err(*args):
        p = subprocess.run([KILN, "serve", *args], capture_output=True, text=True, timeout=60)
        return p.returncode, p.stderr
    rc, err = rc_err()
    check(rc == 2 and "expected one engine file" in err, "serve without an engine: %d %s" % (rc, err))
    rc, err = rc_err(os.path.join(T, "kjv.kiln"), "--port", "70000")
    check(rc == 2 and "--port" in err, "a bad --port: %d %s" % (rc, err))
    rc, err = rc_err(os.path.join(T, "nothing.kiln"), "--device", "cpu", "--port", str(free_port()))
    check(rc == 1 and "nothing.kiln" in err, "a missing engine: %d %s" % (rc, err))
    rc, err = rc_err(os.path.join(T, "kjv.kiln"), "--host", "localhost")
    check(rc == 1 and "hint:" in err, "a host that is not an address: %d %s" % (rc, err))


def main():
    check_usage()
    s = Server(os.path.join(T, "chat.kiln"), "--api-key", KEY, "--model-name", "kjv", "--max-batch", "4", "--drain-seconds", "120")
    try:
        want, pieces = check_completions(s)
        check_stop(s, want, pieces)
        want_chat = check_chat(s)
        check_errors(s)
        check_misc(s)
        check_sampling_features(s)
        check_disconnect(s)
        check_openai(s, want, want_chat)
        check_drain(s)
    finally:
        s.stop()
        if failed:
            print(s.logtext()[-3000:], file=sys.stderr)
    check_queue()
    check_preemption()


try:
    main()
except Exception as e:  # a crash is a failure, with the servers stopped
    import traceback
    traceback.print_exc()
    failed += 1
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)

#!/usr/bin/env python3
"""serve_soak.py — a long run of `kiln serve` at a steady request rate, to show
the server's own path (HTTP, parsing, the scheduler thread, streaming,
cancellation, preemption) leaks nothing and loses nothing.

It starts `kiln serve ENGINE` itself (so it can watch the process), sends a
mix of requests at a fixed Poisson rate for --minutes, and checks every one:

  - completions and chat, streamed and not; n = 1..3; logprobs; penalties;
    min_p; stop strings; seeded sampling and greedy;
  - a share of streamed requests whose client hangs up after the first
    chunk (the server must cancel them and free their KV memory);
  - a KV memory small enough (--kv-memory) that requests get preempted.

Every request must end with the right status and a well-formed body (usage
present, completion_tokens = max_tokens for ignore_eos requests, n choices,
logprobs entries for every token). Every 10 s it samples the server's
resident memory (VmRSS) and /metrics. At the end:

  PASS/FAIL  no request failed or went unanswered
  PASS/FAIL  resident memory did not grow: the median of the last fifth of the
             samples is within --rss-growth (default 5%) of the median of the
             second fifth (the first fifth is warm-up)
  PASS/FAIL  the server's finished counters add up to what was sent
  PASS/FAIL  it drains and exits 0 on SIGTERM

Writes --out DIR/soak.json (settings, counts, RSS samples, metrics) and
prints a summary. Exit 0 when every check passed, 1 otherwise.

    python3 bench/serve_soak.py build/kiln kjv.kiln --device cpu --minutes 60 --rate 4 --out soak
"""
import argparse, http.client, json, os, random, signal, socket, statistics, subprocess, sys, threading, time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss_kib(pid):
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class Soak:
    def __init__(self, a):
        self.a = a
        self.port = free_port()
        self.lock = threading.Lock()
        self.counts = {"sent": 0, "ok": 0, "failed": 0, "hung_up": 0}
        self.failures = []
        self.kinds = {}
        self.samples = []

    def fail(self, kind, why):
        with self.lock:
            self.counts["failed"] += 1
            if len(self.failures) < 50:
                self.failures.append("%s: %s" % (kind, why))

    def ok(self, kind):
        with self.lock:
            self.counts["ok"] += 1
            self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def request(self, method, path, body=None, timeout=300):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        c.close()
        return r.status, raw

    def one(self, rng, i):
        """One request of a random kind; checks what came back."""
        kind = rng.choice(["plain", "stream", "chat", "chat_stream", "n3", "logprobs", "penalties", "stop",
                           "hangup", "sampled"])
        n_out = rng.randint(4, 48)
        prompt = rng.choice(["In the beginning", "And God said", "The LORD is my", "Blessed are the",
                             "And it came to pass"]) + " " * rng.randint(0, 2)
        body = {"model": "soak", "max_tokens": n_out, "ignore_eos": True, "temperature": 0}
        chat = kind.startswith("chat")
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if kind == "n3":
            body.update(n=3, temperature=0.9, seed=i)
        if kind == "logprobs":
            body["logprobs"] = 2
        if kind == "penalties":
            body.update(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2, min_p=0.05,
                        temperature=0.8, seed=i)
        if kind == "stop":
            body.update(stop=[",", "\n"], ignore_eos=False)
        if kind == "sampled":
            body.update(temperature=1.0, top_p=0.9, top_k=40, seed=i)
        stream = kind in ("stream", "chat_stream", "hangup")
        body["stream"] = stream
        if stream:
            body["stream_options"] = {"include_usage": True}
        path = "/v1/chat/completions" if chat else "/v1/completions"
        with self.lock:
            self.counts["sent"] += 1
        try:
            if kind == "hangup":
                s = socket.create_connection(("127.0.0.1", self.port), timeout=60)
                data = json.dumps(body)
                s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                           "\r\n%s" % (path, len(data), data)).encode())
                got = s.recv(64)
                s.close()
                if not got.startswith(b"HTTP/1.1 200"):
                    return self.fail(kind, "status line %r" % got[:40])
                with self.lock:
                    self.counts["hung_up"] += 1
                return self.ok(kind)
            st, raw = self.request("POST", path, body)
            if st != 200:
                return self.fail(kind, "HTTP %d %r" % (st, raw[:200]))
            if stream:
                events = [e[6:] for e in raw.decode().split("\n\n") if e.startswith("data: ")]
                if not events or events[-1] != "[DONE]":
                    return self.fail(kind, "no [DONE]")
                chunks = [json.loads(e) for e in events[:-1]]
                usage = chunks[-1].get("usage") if chunks else None
                if not usage or chunks[-1]["choices"] != []:
                    return self.fail(kind, "no usage chunk")
            else:
                r = json.loads(raw)
                usage = r.get("usage")
                want_n = body.get("n", 1)
                if len(r.get("choices", [])) != want_n:
                    return self.fail(kind, "%d choices" % len(r.get("choices", [])))
                if kind == "logprobs":
                    lp = r["choices"][0]["logprobs"]
                    if len(lp["tokens"]) != usage["completion_tokens"]:
                        return self.fail(kind, "%d logprobs for %d tokens" % (len(lp["tokens"]), usage["completion_tokens"]))
            want_tokens = n_out * body.get("n", 1)
            if body.get("ignore_eos") and usage["completion_tokens"] != want_tokens:
                return self.fail(kind, "completion_tokens %d, want %d" % (usage["completion_tokens"], want_tokens))
            if usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]:
                return self.fail(kind, "usage does not add up: %r" % usage)
            self.ok(kind)
        except Exception as e:  # any transport or parse error is a failed request
            self.fail(kind, "%s: %s" % (type(e).__name__, e))

    def metrics(self):
        try:
            st, raw = self.request("GET", "/metrics", timeout=30)
        except OSError:
            return {}
        vals = {}
        for line in raw.decode().splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                try:
                    vals[k] = float(v)
                except ValueError:
                    pass
        return vals

    def run(self):
        a = self.a
        log = open(os.path.join(a.out, "serve.log"), "w")
        args = [a.kiln, "serve", a.engine, "--device", a.device, "--port", str(self.port), "--model-name", "soak",
                "--max-batch", str(a.max_batch), "--max-queue", "100000"]
        if a.kv_memory:
            args += ["--kv-memory", a.kv_memory]
        p = subprocess.Popen(args, stdout=log, stderr=log)
        t_end = time.time() + 120
        while time.time() < t_end:
            try:
                if self.request("GET", "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if p.poll() is not None:
                print("the server exited before it was ready", file=sys.stderr)
                return 1
            time.sleep(0.2)
        rng = random.Random(a.seed)
        threads = []
        t0 = time.time()
        deadline = t0 + a.minutes * 60
        next_sample = t0
        next_send = t0
        i = 0
        while time.time() < deadline:
            now = time.time()
            if now >= next_sample:
                m = self.metrics()
                self.samples.append({"t": round(now - t0, 1), "rss_kib": rss_kib(p.pid), "sent": self.counts["sent"],
                                     "running": m.get("kiln_requests_running"), "waiting": m.get("kiln_requests_waiting"),
                                     "preemptions": m.get("kiln_preemptions_total"),
                                     "kv_usage": m.get("kiln_kv_cache_usage_ratio")})
                next_sample += 10
            if now >= next_send:
                th = threading.Thread(target=self.one, args=(random.Random(rng.random()), i), daemon=True)
                th.start()
                threads.append(th)
                i += 1
                next_send += rng.expovariate(a.rate)
                threads = [t for t in threads if t.is_alive()]
            time.sleep(min(0.005, max(0, min(next_send, next_sample) - time.time())))
        for t in threads:
            t.join(300)
        unanswered = sum(t.is_alive() for t in threads)
        time.sleep(1)  # let hung-up requests be cancelled
        m_end = self.metrics()
        self.samples.append({"t": round(time.time() - t0, 1), "rss_kib": rss_kib(p.pid), "sent": self.counts["sent"]})
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(120)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = -9
        checks = []

        def check(ok, what):
            checks.append(("PASS" if ok else "FAIL") + "  " + what)

        c = self.counts
        check(c["failed"] == 0 and unanswered == 0 and c["ok"] == c["sent"],
              "%d requests sent, %d ok, %d failed, %d unanswered (%d hung up on purpose)" % (
                  c["sent"], c["ok"], c["failed"], unanswered, c["hung_up"]))
        rss = [s["rss_kib"] for s in self.samples if s.get("rss_kib")]
        fifth = max(1, len(rss) // 5)
        early, late = statistics.median(rss[fifth:2 * fifth] or rss), statistics.median(rss[-fifth:])
        growth = (late - early) / early if early else 0
        check(growth <= a.rss_growth, "resident memory %.1f MiB after warm-up, %.1f MiB at the end (%+.1f%%, limit %+.0f%%)"
              % (early / 1024, late / 1024, 100 * growth, 100 * a.rss_growth))
        fin = sum(v for k, v in m_end.items() if k.startswith("kiln_requests_finished_total"))
        choices = c["sent"] + 2 * self.kinds.get("n3", 0)  # n=3 requests finish three choices
        check(fin == choices and m_end.get("kiln_requests_running") == 0 and m_end.get("kiln_requests_waiting") == 0,
              "the server finished %d choices of %d, running %s, waiting %s" % (
                  fin, choices, m_end.get("kiln_requests_running"), m_end.get("kiln_requests_waiting")))
        check(rc == 0, "SIGTERM: drained and exited %d" % rc)
        res = {"settings": vars(a), "counts": c, "kinds": self.kinds, "failures": self.failures, "checks": checks,
               "preemptions": m_end.get("kiln_preemptions_total"), "rss_samples": self.samples,
               "metrics_end": {k: v for k, v in m_end.items() if "bucket" not in k}}
        json.dump(res, open(os.path.join(a.out, "soak.json"), "w"), indent=1)
        print("\n".join(checks))
        print("preemptions %s, kinds %s" % (m_end.get("kiln_preemptions_total"), self.kinds))
        for f in self.failures[:10]:
            print("  failure:", f)
        return 0 if all(x.startswith("PASS") for x in checks) else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kiln")
    ap.add_argument("engine")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--rate", type=float, default=4, help="requests per second (Poisson)")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--kv-memory", default="", help="the server's --kv-memory (small: preemptions)")
    ap.add_argument("--rss-growth", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="soak")
    a = ap.parse_args()
    if a.minutes <= 0 or a.rate <= 0:
        ap.error("--minutes and --rate must be > 0")
    os.makedirs(a.out, exist_ok=True)
    sys.exit(Soak(a).run())


if __name__ == "__main__":
    main()

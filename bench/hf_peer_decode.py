#!/usr/bin/env python3
"""HF transformers as the decode peer on one checkpoint (any architecture transformers loads),
measured as ../shared/peers/hf_baselines.py's hf_runs measures generate: the time of generate
with 1 new token (ttft) and with N + 1 (greedy, min_new_tokens forcing the length); decode
tok/s = B * N / (t(N + 1) - t(1)), best of 2 each, after a warm-up.

  python3 bench/hf_peer_decode.py --ckpt /tmp/q3 [--attn eager,sdpa] [--batch 1,8] [--prompt 128] [--new 128]

One JSON line per (attention, batch): impl, model, attn, batch, prompt, new, ttft_s,
decode_ms_per_step, decode_tok_per_s, torch, transformers, gpu."""
import argparse, json, os, time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--attn", default="eager,sdpa")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    a = ap.parse_args()
    for attn in a.attn.split(","):
        model = transformers.AutoModelForCausalLM.from_pretrained(a.ckpt, dtype=torch.bfloat16,
                                                                  attn_implementation=attn).cuda().eval()
        V = model.config.vocab_size
        g = torch.Generator(device="cuda").manual_seed(1)
        for B in (int(b) for b in a.batch.split(",")):
            ids = torch.randint(0, V, (B, a.prompt), device="cuda", generator=g)

            @torch.inference_mode()
            def gen(n):
                torch.cuda.synchronize()
                t0 = time.time()
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, pad_token_id=0)
                torch.cuda.synchronize()
                return time.time() - t0

            gen(4)
            t1 = min(gen(1) for _ in range(2))
            tn = min(gen(a.new + 1) for _ in range(2))
            print(json.dumps({"impl": "hf_" + attn, "model": os.path.basename(a.ckpt.rstrip("/")), "attn": attn,
                              "batch": B, "prompt": a.prompt, "new": a.new, "ttft_s": t1,
                              "decode_ms_per_step": (tn - t1) / a.new * 1e3,
                              "decode_tok_per_s": B * a.new / (tn - t1), "torch": torch.__version__,
                              "transformers": transformers.__version__,
                              "gpu": torch.cuda.get_device_name()}), flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

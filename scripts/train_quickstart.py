#!/usr/bin/env python3
"""train_quickstart.py — the quick-start model models/kjv-tiny, from data to goldens.

Three steps, each a subcommand:

  prepare    King James Version text from Debian's bible-kjv-text package
             (public domain), extracted with the package's own `bible` program
             (package bible-kjv): `apt-get download`, `dpkg-deb -x`, no install,
             no network at training time. Writes OUT/kjv.txt: one verse per line,
             references stripped, chapters separated by one empty line.
                 python3 scripts/train_quickstart.py prepare --out .carry/quickstart

  tokenizer  a byte-level BPE tokenizer (GPT-2/llama3 family: ByteLevel
             pre-tokenizer with the GPT-2 regex, ByteLevel decoder) trained with
             HF `tokenizers` on the training chapters only; specials <s> (0) and
             </s> (1); writes tokenizer.json and tokenizer_config.json.
                 python3 scripts/train_quickstart.py tokenizer --data .carry/quickstart/kjv.txt --out models/kjv-tiny

  train      a LlamaForCausalLM trained with PyTorch (bf16 autocast, AdamW,
             warmup + cosine, residual dropout through hooks, the best checkpoint
             by held-out loss kept), saved in bf16 with save_pretrained; then
             fp32 CPU greedy goldens (golden.json) and the held-out perplexity.
                 python3 scripts/train_quickstart.py train --data .carry/quickstart/kjv.txt \\
                     --tokenizer models/kjv-tiny --out $OUT/kjv-tiny --minutes 2.5
             --smoke runs a handful of steps of a tiny model on CPU.

The split is fixed: chapter k (0-based, in canonical order, 1,189 chapters) is
held out when k % 50 == 25 (24 chapters). Documents are chapters:
"<s>" + verses joined by "\\n" + "</s>". Training samples random windows of the
concatenated training documents.
"""
import argparse
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HELDOUT_EVERY, HELDOUT_AT = 50, 25
BOS, EOS = "<s>", "</s>"
GOLDEN_PROMPTS = ["In the beginning", "And it came to pass", "Blessed are the"]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


# ---------------------------------------------------------------- data


def cmd_prepare(a):
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as td:
        debs = a.debs
        if not debs:
            subprocess.run(["apt-get", "download", "bible-kjv-text", "bible-kjv"], cwd=td, check=True)
            debs = [os.path.join(td, f) for f in sorted(os.listdir(td)) if f.endswith(".deb")]
        x = os.path.join(td, "x")
        for d in debs:
            print(f"{os.path.basename(d)}  sha256 {sha256(d)}")
            subprocess.run(["dpkg-deb", "-x", d, x], check=True)
        raw = subprocess.run([os.path.join(x, "usr/bin/bible"), "-f", "-p", os.path.join(x, "usr/lib"),
                              "Gen1:1-Rev22:21"], check=True, capture_output=True, text=True).stdout
        shutil.copy(os.path.join(x, "usr/share/doc/bible-kjv-text/copyright"), os.path.join(a.out, "copyright"))
    ref = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")
    chapters, last = [], None
    for line in raw.splitlines():
        m = ref.match(line)
        if not m:
            sys.exit(f"prepare: unexpected line from bible: {line[:80]!r}")
        key = (m.group(1), m.group(2))
        if key != last:
            chapters.append([])
            last = key
        chapters[-1].append(m.group(4).strip())
    text = "\n\n".join("\n".join(c) for c in chapters) + "\n"
    path = os.path.join(a.out, "kjv.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    nv = sum(len(c) for c in chapters)
    print(f"{path}: {len(chapters)} chapters, {nv} verses, {len(text)} bytes, sha256 {sha256(path)}")


def load_chapters(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    chapters = [c for c in text.strip("\n").split("\n\n")]
    if len(chapters) != 1189:
        sys.exit(f"{path}: {len(chapters)} chapters, expected 1189 (run the prepare step)")
    return chapters


def split(chapters):
    train = [c for k, c in enumerate(chapters) if k % HELDOUT_EVERY != HELDOUT_AT]
    held = [c for k, c in enumerate(chapters) if k % HELDOUT_EVERY == HELDOUT_AT]
    return train, held


# ---------------------------------------------------------------- tokenizer


def cmd_tokenizer(a):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    train, _ = split(load_chapters(a.data))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, min_frequency=2, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(train, trainer=trainer, length=len(train))
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))])
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1
    os.makedirs(a.out, exist_ok=True)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
           "add_bos_token": True, "add_eos_token": False, "model_max_length": 512,
           "clean_up_tokenization_spaces": False}
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    n = sum(len(tok.encode(c, add_special_tokens=False).ids) for c in train)
    print(f"vocab {tok.get_vocab_size()}; training chapters: {n} tokens, "
          f"{sum(len(c) for c in train) / n:.2f} bytes/token")


# ---------------------------------------------------------------- model


def model_config(a, vocab):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
                       num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                       head_dim=a.hidden // a.heads, max_position_embeddings=a.context, rms_norm_eps=1e-5,
                       tie_word_embeddings=True, bos_token_id=0, eos_token_id=1,
                       hidden_act="silu", attention_bias=False, mlp_bias=False, attention_dropout=0.0)


def encode_docs(tok, chapters):
    ids = []
    for c in chapters:
        ids.append(0)
        ids.extend(tok.encode(c, add_special_tokens=False).ids)
        ids.append(1)
    return ids


def cmd_train(a):
    import torch
    import torch.nn.functional as F
    from tokenizers import Tokenizer
    from transformers import GenerationConfig, LlamaForCausalLM

    t_start = time.time()
    torch.manual_seed(a.seed)
    dev = "cpu" if a.smoke or not torch.cuda.is_available() else "cuda"
    if a.smoke:
        a.hidden, a.ffn, a.layers, a.heads, a.kv_heads, a.context = 64, 160, 2, 4, 2, 128
        a.batch, a.max_steps, a.eval_every, a.warmup = 4, 12, 4, 4
    print(f"torch {torch.__version__}, device {dev}" + (f" ({torch.cuda.get_device_name()})" if dev == "cuda" else ""),
          flush=True)
    print(f"data {a.data} sha256 {sha256(a.data)}", flush=True)
    tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
    train_ch, held_ch = split(load_chapters(a.data))
    train_ids = torch.tensor(encode_docs(tok, train_ch), dtype=torch.long)
    held_ids = torch.tensor(encode_docs(tok, held_ch), dtype=torch.long)
    print(f"train {len(train_ch)} chapters {len(train_ids)} tokens; held-out {len(held_ch)} chapters "
          f"{len(held_ids)} tokens", flush=True)

    cfg = model_config(a, tok.get_vocab_size())
    model = LlamaForCausalLM(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {a.layers} layers, hidden {a.hidden}, ffn {a.ffn}, heads {a.heads}/{a.kv_heads}, "
          f"context {a.context}, vocab {cfg.vocab_size}: {n_params} parameters", flush=True)

    # residual dropout on the output of each attention and MLP branch (training only; the
    # saved model is a plain Llama)
    def drop(mod, inp, out):
        return F.dropout(out, p=a.dropout, training=mod.training)

    hooks = []
    for layer in model.model.layers:
        hooks.append(layer.self_attn.o_proj.register_forward_hook(drop))
        hooks.append(layer.mlp.down_proj.register_forward_hook(drop))

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=(dev == "cuda"))
    budget = a.minutes * 60.0
    gen = torch.Generator().manual_seed(a.seed)
    T = a.context

    def held_rows():
        n = (len(held_ids) - 1) // T
        x = held_ids[: n * T].view(n, T)
        y = held_ids[1: n * T + 1].view(n, T)
        return x, y

    hx, hy = held_rows()
    if a.smoke:  # a few held-out rows are enough to see it run
        hx, hy = hx[:8], hy[:8]

    @torch.no_grad()
    def held_loss(m, autocast):
        m.eval()
        tot, cnt = 0.0, 0
        for i in range(0, hx.shape[0], 32):
            x, y = hx[i:i + 32].to(dev), hy[i:i + 32].to(dev)
            with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=autocast):
                logits = m(input_ids=x).logits
            tot += F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
            cnt += y.numel()
        m.train()
        return tot / cnt

    log = {"args": vars(a), "parameters": n_params, "train_tokens": len(train_ids), "heldout_tokens": len(held_ids),
           "steps": []}
    best = (float("inf"), -1, None)
    step, t0, tokens_seen = 0, time.time(), 0
    model.train()
    while True:
        elapsed = time.time() - t0
        progress = max(step / a.max_steps, elapsed / budget)
        if progress >= 1.0:
            break
        if step < a.warmup:
            lr = a.lr * (step + 1) / a.warmup
        else:
            lr = a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        off = torch.randint(0, len(train_ids) - T - 1, (a.batch,), generator=gen)
        idx = off[:, None] + torch.arange(T + 1)[None, :]
        w = train_ids[idx].to(dev, non_blocking=True)
        x, y = w[:, :-1], w[:, 1:]
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=(dev == "cuda")):
            logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += x.numel()
        if step % a.eval_every == 0:
            hl = held_loss(model, dev == "cuda")
            tl = loss.item()
            ep = tokens_seen / len(train_ids)
            rec = {"step": step, "seconds": round(time.time() - t0, 2), "epochs": round(ep, 2), "lr": lr,
                   "train_loss": round(tl, 4), "heldout_loss": round(hl, 4)}
            log["steps"].append(rec)
            mark = ""
            if hl < best[0]:
                best = (hl, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
                mark = " *"
            print(f"step {step:5d}  {rec['seconds']:7.1f}s  epoch {ep:6.2f}  lr {lr:.2e}  train {tl:.4f}  "
                  f"held-out {hl:.4f} (ppl {math.exp(hl):.2f}){mark}", flush=True)
    train_seconds = time.time() - t0
    print(f"trained {step} steps in {train_seconds:.1f}s ({tokens_seen} tokens, "
          f"{tokens_seen / len(train_ids):.1f} epochs); best held-out {best[0]:.4f} at step {best[1]}", flush=True)
    for h in hooks:
        h.remove()
    if best[2] is not None:
        model.load_state_dict(best[2])

    # save in bf16; everything after this uses the saved file, in fp32, on the CPU
    os.makedirs(a.out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(a.out, safe_serialization=True)
    GenerationConfig(bos_token_id=0, eos_token_id=1, do_sample=False).save_pretrained(a.out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer, f), os.path.join(a.out, f))
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    m32 = LlamaForCausalLM.from_pretrained(a.out, dtype=torch.float32, attn_implementation="eager").eval()
    dev = "cpu"
    hl32 = held_loss(m32, False)
    print(f"saved bf16 model, fp32 CPU held-out loss {hl32:.4f}, perplexity {math.exp(hl32):.3f} "
          f"({len(hy.view(-1))} tokens)", flush=True)

    golden = {"model": os.path.basename(os.path.normpath(a.out)), "dtype": "float32 (bf16 weights), CPU, eager attention",
              "torch": torch.__version__, "max_new_tokens": a.golden_tokens, "cases": []}
    import transformers
    golden["transformers"] = transformers.__version__
    for text in GOLDEN_PROMPTS:
        prompt = tok.encode(text, add_special_tokens=True).ids
        ids, margins = list(prompt), []
        with torch.no_grad():
            for _ in range(a.golden_tokens):
                logits = m32(input_ids=torch.tensor([ids])).logits[0, -1]
                top = torch.topk(logits, 2)
                margins.append(round((top.values[0] - top.values[1]).item(), 6))
                ids.append(int(top.indices[0]))
                if ids[-1] == 1:
                    break
            ref = m32.generate(torch.tensor([prompt]), max_new_tokens=a.golden_tokens, do_sample=False,
                               eos_token_id=1, pad_token_id=1)[0].tolist()
        new = ids[len(prompt):]
        case = {"text": text, "prompt": prompt, "greedy": new,
                "completion_text": tok.decode(new, skip_special_tokens=True),
                "min_margin": min(margins), "min_margin_step": margins.index(min(margins)), "margins": margins,
                "generate_agrees": ref[len(prompt):] == new}
        golden["cases"].append(case)
        print(f"\n[{text}] min margin {case['min_margin']:.4f} at step {case['min_margin_step']}, "
              f"generate() agrees: {case['generate_agrees']}\n{text}{case['completion_text']}", flush=True)
    with open(os.path.join(a.out, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    log.update({"train_seconds": round(train_seconds, 1), "total_steps": step, "tokens_seen": tokens_seen,
                "best_step": best[1], "best_heldout_loss_bf16_autocast": round(best[0], 4),
                "heldout_loss_fp32": round(hl32, 4), "heldout_perplexity_fp32": round(math.exp(hl32), 3),
                "heldout_loss_tokens": int(hy.numel()), "wall_seconds": round(time.time() - t_start, 1)})
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump(log, f, indent=1)
        f.write("\n")
    print(f"\nwrote {a.out}: " + ", ".join(f"{f} {os.path.getsize(os.path.join(a.out, f))}"
                                         for f in sorted(os.listdir(a.out))), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("prepare", help="extract the KJV text from the Debian packages")
    s.add_argument("--out", default=".carry/quickstart")
    s.add_argument("--debs", nargs="*", help="use these .deb files instead of apt-get download")
    s = sub.add_parser("tokenizer", help="train the byte-level BPE tokenizer")
    s.add_argument("--data", default=".carry/quickstart/kjv.txt")
    s.add_argument("--out", default="models/kjv-tiny")
    s.add_argument("--vocab", type=int, default=4096)
    s = sub.add_parser("train", help="train the model, save it, write goldens")
    s.add_argument("--data", default=".carry/quickstart/kjv.txt")
    s.add_argument("--tokenizer", default="models/kjv-tiny")
    s.add_argument("--out", required=True)
    s.add_argument("--minutes", type=float, default=2.5, help="training time budget (the cosine runs over it)")
    s.add_argument("--max-steps", type=int, default=3000)
    s.add_argument("--hidden", type=int, default=256)
    s.add_argument("--ffn", type=int, default=640)
    s.add_argument("--layers", type=int, default=5)
    s.add_argument("--heads", type=int, default=8)
    s.add_argument("--kv-heads", type=int, default=4)
    s.add_argument("--context", type=int, default=512)
    s.add_argument("--batch", type=int, default=32)
    s.add_argument("--lr", type=float, default=2e-3)
    s.add_argument("--min-lr-frac", type=float, default=0.05)
    s.add_argument("--warmup", type=int, default=150)
    s.add_argument("--weight-decay", type=float, default=0.1)
    s.add_argument("--dropout", type=float, default=0.1)
    s.add_argument("--eval-every", type=int, default=50)
    s.add_argument("--golden-tokens", type=int, default=60)
    s.add_argument("--seed", type=int, default=1234)
    s.add_argument("--smoke", action="store_true", help="a tiny model, a few CPU steps")
    a = p.parse_args()
    {"prepare": cmd_prepare, "tokenizer": cmd_tokenizer, "train": cmd_train}[a.cmd](a)


if __name__ == "__main__":
    main()

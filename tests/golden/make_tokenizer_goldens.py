#!/usr/bin/env python3
"""Write the tokenizer corpus and golden encodings for tests/test_tokenizer.c.

The reference is HuggingFace `tokenizers` (PyPI), loaded with
Tokenizer.from_file on the real tokenizer.json files in
$KILN_SHARED_DIR/tokenizers/{llama2,llama3,qwen3}. Nothing here is produced
by kiln itself.

Outputs (tests/golden/tokenizer/):
  corpus.jsonl          one JSON string per line: the texts to encode
  <name>.jsonl          one object per corpus line, same order:
      ids       encode(text, add_special_tokens=False)
      ids_sp    encode(text, add_special_tokens=True)   (only when it differs from ids)
      ids_nosp  encode with encode_special_tokens=True, i.e. special-token strings
                taken as plain text (only when it differs from ids)
      dec       decode(ids, skip_special_tokens=False)
      dec_skip  decode(ids, skip_special_tokens=True)   (only when it differs from dec)
      rt        dec == text (HF's own round-trip property for this text)
  <name>_decode.jsonl   decode goldens for id sequences that do not come from
                        encoding: random ids, lone byte-fallback pieces, cut
                        UTF-8 sequences: {"ids": [...], "dec": ..., "dec_skip": ...}
  synth_corpus.jsonl, llama2_synth.jsonl
                        encodings by a synthetic variant of llama2's
                        tokenizer.json with three more added tokens that use
                        lstrip/rstrip, normalized=true and special=false (see
                        synth_tokenizer(); the test builds the same variant).
  unk_corpus.jsonl, llama2_unk_fused.jsonl, llama2_unk_unfused.jsonl
                        llama2 with byte_fallback=false, fuse_unk true/false:
                        unknown characters become <unk> (unk_tokenizer()).

Usage: python3 tests/golden/make_tokenizer_goldens.py [SHARED_DIR]
Deterministic: the corpus uses a fixed random seed.
"""
import json
import os
import random
import sys
import tempfile
import unicodedata

os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "tokenizer")
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "..", "shared")
NAMES = ["llama2", "llama3", "qwen3"]


def nfd(s):
    return unicodedata.normalize("NFD", s)


PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world",
    "Hello, world! How are you doing today?",
    "It was the best of times, it was the worst of times, it was the age of wisdom, "
    "it was the age of foolishness, it was the epoch of belief, it was the epoch of incredulity.",
    "Call me Ishmael. Some years ago—never mind how long precisely—having little or no money "
    "in my purse, and nothing particular to interest me on shore, I thought I would sail about "
    "a little and see the watery part of the world.",
    "I'm sure you'll agree: we've done what they'd asked, and it's fine. Don't worry.",
    "SHE'S HERE. WE'LL GO. THEY'VE LEFT. I'M DONE. YOU'D KNOW. IT'S OK. DON'T.",
    "o'clock, rock'n'roll, 'quoted', \"double quoted\", ‘curly’ “quotes”",
    "The year is 2024 and the price is $19.99 (about €18.50 or £15.75).",
    "e.g. i.e. etc. Mr. Smith vs. Dr. Jones — an em dash – an en dash … ellipsis",
    "  leading spaces and trailing spaces   ",
    "ALL CAPS SENTENCE WITH SOME Mixed Case Words AndCamelCase and snake_case_words.",
    "A sentence.\nAnother line.\n\nA new paragraph after a blank line.\n",
    "Tab\tseparated\tvalues\tin\ta\trow",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    "naïve café résumé coöperate façade jalapeño Zürich São Paulo",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
    "it'ſ a long s, 'ſ alone, 'ﬆ ligature, 'K kelvin",
    "x's y'S z'Ll w'rE",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt "
    "ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation.",
]

CODE = [
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'
    "    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "import os, sys\n\nclass Foo(object):\n\tdef __init__(self, x: int = 0) -> None:\n\t\tself.x = x\n",
    "for i in range(10):\n    print(f\"{i:>4d} {i**2:08.3f}\")  # comment\n",
    "x = [1, 2, 3]\ny = {'a': 1, \"b\": [None, True, False]}\nlambda z: z*2 if z else -1\n",
    "#include <stdio.h>\n\nint main(int argc, char **argv) {\n    printf(\"hello %s\\n\", argv[0]);\n"
    "    return 0;\n}\n",
    "static inline uint32_t rd(const uint8_t *p) { return p[0] | p[1] << 8; } /* LE */\n",
    "while (*p && *p != '\\0') { p++; } // C++ style comment\r\n",
    '{"name": "kiln", "version": "0.1.0", "tags": ["a", "b"], "nested": {"x": 1.5e-3, "y": null}}',
    '[\n  {\n    "id": 1,\n    "ok": true\n  },\n  {\n    "id": 2,\n    "ok": false\n  }\n]\n',
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\" | tr a-z A-Z; done\n",
    "<html><head><title>Test</title></head><body><p class=\"x\">Hi &amp; bye</p></body></html>",
    "SELECT id, name FROM users WHERE age >= 21 AND name LIKE '%son' ORDER BY id DESC;",
    "```python\nprint('hi')\n```\n\n* bullet\n* list\n\n1. one\n2. two\n",
    "fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!(\"{:?}\", v); }",
    "a+=b;c-=d;e*=f;g/=h;i%=j;k<<=1;l>>=2;m&&n||!o;p->q;r::s;t...u;",
    "        deeply_indented_line()\n                even_deeper()\n",
    "if x:\n\n\n    pass\n    \n    \n",
    "0x7fffffff 0b1010 0o777 1_000_000 3.14e+10 .5 5. -0.0 +1",
]

WHITESPACE = [
    " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", "\r", "\r\r\n",
    " \n", "\n ", " \n ", "a\n", "\na", "a\r\nb", "a \r\n b", "a\n\nb", "a  \n  b", "x \t y",
    "trailing   ", "   leading", "  both  ", "a\tb\tc", "\t\tx", "word\n\n\n\nword", " \t \n \t ",
    "\u00a0non-breaking\u00a0space", "ideographic\u3000space", "line\u2028separator", "para\u2029sep",
    "\u2003em\u2002en\u2009thin\u200ahair", "\x0bvertical\x0cformfeed", "a\u0085b",
    "end with newline\n", "end with spaces and newline   \n", "    \n    \n", "\n    x",
]

NUMBERS = [
    "0", "7", "42", "123", "1234", "12345", "123456", "1234567", "12345678901234567890",
    "3.14159265358979", "1,234,567", "1,234,567.89", "-42", "+17", "1e10", "2024-01-15",
    "12:34:56", "192.168.0.1", "+1 (555) 123-4567", "99%", "1/2", "½ ¼ ¾", "x² y³ z¹",
    "①②③ Ⅻ Ⅳ", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "１２３４５", "v1.2.3-rc.4", "a1b2c3d4",
    "3000000000000000000000000000000000000000000000000000000000000000000000000001",
    "0.000000000001", "123abc456def", "007", "10000 20000 30000",
]

SCRIPTS = [
    "你好，世界！这是一个测试。",
    "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
    "日本語のテキスト：ひらがな、カタカナ、漢字を含みます。",
    "東京は日本の首都です。",
    "안녕하세요, 세계! 한국어 텍스트입니다.",
    "대한민국의 수도는 서울입니다.",
    "مرحبا بالعالم! هذا نص باللغة العربية.",
    "اللغة العربية جميلة",
    "שלום עולם! זהו טקסט בעברית.",
    "Γειά σου Κόσμε! Αυτό είναι ελληνικό κείμενο.",
    "Привет, мир! Это текст на русском языке.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "สวัสดีชาวโลก นี่คือข้อความภาษาไทย",
    "नमस्ते दुनिया! यह हिंदी पाठ है।",
    "Xin chào thế giới! Đây là văn bản tiếng Việt.",
    "Здравствуйте 你好 こんにちは 안녕 مرحبا שלום Γειά hello",
    "ქართული ენა", "Հայերեն", "ᚠᛇᚻ᛫ᛒᛦᚦ", "ⴰⵣⵓⵍ", "ᐊᐃᑦᑎᑐᑦ",
    "mixed中文and English混合text",
    "Ǆ ǅ ǆ ﬁ ﬂ ß ẞ İ ı",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙 𝐁𝐨𝐥𝐝",
    "𠀀𠀁𪚥 rare CJK extension B",
    "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ",
]

EMOJI = [
    "😀", "😀😃😄", "I ❤️ kiln", "👍🏽", "👍🏻👍🏼👍🏽👍🏾👍🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🏴‍☠️",
    "🇺🇸🇯🇵🇫🇷", "🇺", "1️⃣ #️⃣ *️⃣", "🧑‍🤝‍🧑", "❤", "✓ ✗ ★ ☆ ♠ ♣", "Emoji in text 🎉 party 🎊!",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "a👍b", "🙂 🙃", "\U0001f600" * 3 + " end",
]

COMBINING = [
    "e\u0301", "Cafe\u0301", "re\u0301sume\u0301", "A\u030a", "\u212b", "\u2126", "\u00c5",
    "a\u0323\u0307", "a\u0307\u0323", "q\u0307\u0323", "s\u0323\u0307", "\u1e0b\u0323",
    "o\u0308\u0304", "\u0958\u0959", "\u0f73", "\u0344", "\u1100\u1161\u11a8", "\u1100\u1161",
    "\ud55c\u11a8", "\u1112\u1161\u11ab\u1100\u1173\u11af", "\u0e40\u0e01\u0e4a", "\u0928\u093c",
    "a\u0300\u0301\u0302\u0303\u0304", "\u0301 starts with a mark", "\u0301\u0301\u0301",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u0334\u0335\u031c\u0330\u0354\u036b\u0357\u0362L\u0320\u0368\u0367\u0369\u0358G\u0334\u033b\u0348\u034d\u0354\u0339\u0311\u0357\u030e\u0305\u035b\u0301O",
    "\u0b47\u0b3e", "\u0cc6\u0cc2", "\u09c7\u09be", "\u1025\u102e", "\u0627\u0653",
    "\u05d0\u05b7", "\ufb2e", "\u3099\u304b\u3099", "\u304b\u3099", "\u30cf\u309a",
    "\u00e9\u0301", "\u0041\u030a\u0301", "\u1e9b\u0323", "\u2000", "\u2001", "\uf900",
    "\u2fa1d", "\u0374", "\u037e", "\u0387", "\u1f71", "\u1fee",
]
COMBINING += [nfd(s) for s in [
    "Xin chào thế giới! Đây là văn bản tiếng Việt.",
    "naïve café résumé coöperate façade jalapeño Zürich São Paulo",
    "안녕하세요, 세계! 한국어 텍스트입니다.",
    "Ελληνικά: άέήίόύώ ΐΰ",
    "Ḁḁ Ḃḃ Ṩṩ ẞß Ǻǻ Ǽǽ Ǿǿ",
    "がぎぐげご パピプペポ",
    "Ёлка йод",
]]

CONTROL = [
    "\x00", "a\x00b", "\x01\x02\x03", "\x07bell", "\x08back", "\x1b[31mred\x1b[0m", "\x7f",
    "\x1f\x1e\x1d", "\u0080\u0081\u009f", "zero\u200bwidth", "\ufeffBOM at start", "joiner\u200d",
    "\u200e\u200f\u202a\u202e", "\ufff9\ufffa\ufffb", "\ufffd replacement", "\uffff", "\U0010ffff",
    "\ue000 private use \U000f0000", "soft\u00adhyphen", "\u2060word\u2060joiner",
]

SPECIAL = [
    "<s>", "</s>", "<unk>", "<s>Hello</s>", "<s> Hello </s>", "Hello <s> world", "<s><s></s></s>",
    "<s", "s>", "< s>", "<S>", "<<s>>", "text</s>", "</s>text", "a<s>b", "<s>\n", "\n<s>",
    "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "<|reserved_special_token_0|>", "<|reserved_special_token_250|>", "<|reserved_special_token_251|>",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "<think>", "</think>", "<think>reasoning</think>answer", "<tool_call>", "</tool_call>",
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "<|im_start", "im_start|>", "<|im_start|><|im_start|>",
    "<|vision_start|><|image_pad|><|vision_end|>", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    " <|im_end|> ", "x<|endoftext|>y", "<|endoftext|><|endoftext|>", "<|begin_of_text|> <|begin_of_text|>",
    "<0x41>", "<0xE2><0x82>", "▁Hello▁world", "▁", "▁▁▁", "Ġhello", "Ċ", "ĠĠ",
]

LONG = [
    "a" * 5000, " " * 3000, "\n" * 2000, "1" * 1000, "\U0001f600" * 500, "-" * 1000, "ab" * 1000,
    "中" * 2000, ("e\u0301") * 500, "\t" * 500, "a " * 1000, " a" * 1000, "=" * 777,
    "abc " * 400 + "end", "x" * 3000 + " " * 100 + "y", "\r\n" * 300, "!" * 1500, "é" * 800,
    ("The quick brown fox jumps over the lazy dog. " * 60).strip(),
    "." * 4000, "𝔘" * 300, "가" * 1000, "_" * 2049, "0" * 4096, " " * 1 + "a" * 4097,
]

EDGE = ["", "a", "A", "Z", "é", "中", "?", ".", "'", "''", "'s", "s'", "' s", "'''''", "a'b'c'd"]


def random_entries(rng, n):
    pool = []
    for lst in (PROSE, CODE, WHITESPACE, NUMBERS, SCRIPTS, EMOJI, COMBINING, CONTROL, SPECIAL, EDGE):
        for s in lst:
            if s:
                pool.append(s)
    chars = (list("abcXYZ 019 \t\n\r'.,;:!?-_()[]{}<>|/\\\"#$%&*+=@^`~") +
             list("éüñçÀßøæœ中文字日本語한국어العربيةעבריתΑΒΓαβγабвгд") +
             ["\u0301", "\u0308", "\u200d", "\U0001f600", "\U0001f44d", "\U0001f3fd", "\u00a0", "\u3000",
              "\x00", "\x1b", "\u1100", "\u1161", "\u11a8", "▁", "Ġ"])
    out = []
    for i in range(n):
        kind = rng.randrange(3)
        if kind == 0:   # a few corpus pieces glued with random separators
            parts = [rng.choice(pool)[: rng.randrange(1, 80)] for _ in range(rng.randrange(2, 5))]
            seps = ["", " ", "\n", "  ", "\t", "<s>", "<|im_start|>", "<|eot_id|>", "\r\n"]
            s = ""
            for p in parts:
                s += p + rng.choice(seps)
        elif kind == 1:  # random characters
            s = "".join(rng.choice(chars) for _ in range(rng.randrange(1, 60)))
        else:            # random code points from a few blocks
            blocks = [(0x20, 0x7e), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff),
                      (0x590, 0x5ff), (0x600, 0x6ff), (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff),
                      (0x2000, 0x206f), (0x3040, 0x30ff), (0x4e00, 0x4fff), (0xac00, 0xad00),
                      (0x1f300, 0x1f64f), (0xff00, 0xffef)]
            s = ""
            for _ in range(rng.randrange(1, 40)):
                lo, hi = rng.choice(blocks)
                c = rng.randrange(lo, hi + 1)
                if unicodedata.category(chr(c)) in ("Cs", "Cn"):
                    continue
                s += chr(c)
        out.append(s)
    return out


def wide_unicode_entries(rng, n):
    """Strings over the whole code point range: letters and digits newer than
    Python's Unicode tables (HF's regex engine knows them), unassigned code
    points, spaces PCRE2 and Oniguruma disagree on (U+180E), case-folded
    contractions ('\u017f), marks, and special-token strings in between."""
    out = []
    for _ in range(n):
        s = []
        for _ in range(rng.randrange(1, 30)):
            r = rng.random()
            if r < 0.3:
                c = rng.randrange(0x20, 0x7F)
            elif r < 0.4:
                c = rng.choice([9, 10, 13, 32, 32, 32, 0xA0, 0x3000, 0x2028, 0x85, 0x1680, 0x200B, 0x180E])
            elif r < 0.55:
                c = rng.randrange(0x80, 0x3000)
            elif r < 0.7:
                c = rng.randrange(0x3000, 0x10000)
            elif r < 0.8:
                c = rng.randrange(0x10000, 0x20000)
            elif r < 0.85:
                c = rng.randrange(0x20000, 0x110000)
            elif r < 0.9:
                c = rng.choice([0x301, 0x308, 0x323, 0x17F, 0x212A, 0x130, 0x131, ord("'")])
            else:
                c = rng.randrange(0x300, 0x370)
            if 0xD800 <= c < 0xE000:
                continue
            s.append(chr(c))
            if rng.random() < 0.1:
                s.append("'" + rng.choice("stmdlrvSTMDLRV"))
            if rng.random() < 0.05:
                s.append(rng.choice(["<s>", "</s>", "<|im_start|>", "<|begin_of_text|>", "<think>", "\r\n", "  "]))
        out.append("".join(s))
    return out


def build_corpus():
    corpus = []
    for lst in (EDGE, PROSE, CODE, WHITESPACE, NUMBERS, SCRIPTS, EMOJI, COMBINING, CONTROL, SPECIAL, LONG):
        corpus.extend(lst)
    corpus.extend(random_entries(random.Random(20240531), 160))
    corpus.extend(wide_unicode_entries(random.Random(3), 240))
    return corpus


def dump(path, rows):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=True, separators=(",", ":")) + "\n")


def encode_rows(tok, corpus):
    rows = []
    for text in corpus:
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_sp = tok.encode(text, add_special_tokens=True).ids
        tok.encode_special_tokens = True
        ids_nosp = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        dec = tok.decode(ids, skip_special_tokens=False)
        dec_skip = tok.decode(ids, skip_special_tokens=True)
        row = {"ids": ids}
        if ids_sp != ids:
            row["ids_sp"] = ids_sp
        if ids_nosp != ids:
            row["ids_nosp"] = ids_nosp
        row["dec"] = dec
        if dec_skip != dec:
            row["dec_skip"] = dec_skip
        row["rt"] = dec == text
        rows.append(row)
    return rows


def decode_rows(tok, rng):
    vocab = tok.get_vocab_size(with_added_tokens=True)
    byte_ids = [tok.token_to_id("<0x%02X>" % b) for b in range(256)]
    byte_ids = [i for i in byte_ids if i is not None]
    special = [t for t in (tok.get_added_tokens_decoder() or {})]
    cases = []
    for n in (1, 2, 3, 5, 8, 16, 40):
        for _ in range(12):
            cases.append([rng.randrange(vocab) for _ in range(n)])
    if byte_ids:   # byte-fallback runs: valid, cut and invalid UTF-8
        for _ in range(40):
            cases.append([rng.choice(byte_ids) for _ in range(rng.randrange(1, 7))])
        for text in ["é", "中", "😀", "a😀b", "€uro"]:
            ids = [tok.token_to_id("<0x%02X>" % b) for b in text.encode("utf-8")]
            if None not in ids:
                cases.append(ids)
                cases.append(ids[:-1])
                cases.append(ids[1:])
                cases.append(ids[:-1] + [tok.token_to_id("▁the") or 0] + ids)
    # byte-level pieces cut inside a character
    for text in ["中文", "😀", "é", "a😀b", "👨‍👩‍👧"]:
        ids = tok.encode(text, add_special_tokens=False).ids
        for cut in range(len(ids) + 1):
            cases.append(ids[:cut])
            cases.append(ids[cut:])
    if special:
        for _ in range(20):
            cases.append([rng.choice(special) if rng.random() < 0.4 else rng.randrange(vocab)
                          for _ in range(rng.randrange(1, 10))])
    rows = []
    for ids in cases:
        dec = tok.decode(ids, skip_special_tokens=False)
        row = {"ids": ids, "dec": dec}
        skip = tok.decode(ids, skip_special_tokens=True)
        if skip != dec:
            row["dec_skip"] = skip
        rows.append(row)
    return rows


SYNTH_TEXTS = [
    "", "hello", "a <mask> b", "a<mask>b", "a   <mask>   b", "<mask>", "  <mask>  ", "x\n<mask>\ny",
    "<mask><mask>", "end <mask>", "<mask> start", "foo bar", "a foo b", "afoob", "foo", " foo ",
    "ufoo", "<s> foo </s>", "<s>foo</s>", "tab\t<mask>\tafter", "\u3000<mask>\u3000", "<ctl> x",
    "x<ctl>y", "Hello <ctl><ctl> world", "<mask> foo <ctl> bar <s>",
]


def synth_tokenizer(src_path, out_path):
    """llama2 with extra added tokens exercising the added-token flags."""
    with open(src_path, encoding="utf-8") as f:
        j = json.load(f)
    n = len(j["model"]["vocab"])
    j["added_tokens"] += [
        {"id": n, "content": "<mask>", "single_word": False, "lstrip": True, "rstrip": True,
         "normalized": False, "special": True},
        {"id": n + 1, "content": "foo", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False},
        {"id": n + 2, "content": "<ctl>", "single_word": False, "lstrip": False, "rstrip": True,
         "normalized": False, "special": False},
    ]
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)


UNK_TEXTS = [
    "", "hello", "你好，世界！", "a😀b", "😀😃😄 smile", "日本語 text 中文", "mixed ✓ ✗ ★ marks", "ǅ ǆ", "x\u0301y",
    "Привет мир", "\U0001f3f3\ufe0f\u200d\U0001f308 flag", "tab\t中\t文", "<s>中</s>", "𝔘𝔫𝔦", "\x00\x01",
]


def unk_tokenizer(src_path, out_path, fuse):
    """llama2 without byte_fallback: unknown characters become <unk> (fused or not)."""
    with open(src_path, encoding="utf-8") as f:
        j = json.load(f)
    j["model"]["byte_fallback"] = False
    j["model"]["fuse_unk"] = fuse
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)


def main():
    os.makedirs(OUT, exist_ok=True)
    corpus = build_corpus()
    dump(os.path.join(OUT, "corpus.jsonl"), corpus)
    for name in NAMES:
        tok = Tokenizer.from_file(os.path.join(SHARED, "tokenizers", name, "tokenizer.json"))
        dump(os.path.join(OUT, name + ".jsonl"), encode_rows(tok, corpus))
        dump(os.path.join(OUT, name + "_decode.jsonl"), decode_rows(tok, random.Random(7)))
    with tempfile.TemporaryDirectory() as tmp:
        synth = os.path.join(tmp, "synth_tokenizer.json")
        synth_tokenizer(os.path.join(SHARED, "tokenizers", "llama2", "tokenizer.json"), synth)
        tok = Tokenizer.from_file(synth)
        dump(os.path.join(OUT, "synth_corpus.jsonl"), SYNTH_TEXTS)
        dump(os.path.join(OUT, "llama2_synth.jsonl"), encode_rows(tok, SYNTH_TEXTS))
        dump(os.path.join(OUT, "unk_corpus.jsonl"), UNK_TEXTS)
        for fuse in (True, False):
            path = os.path.join(tmp, "unk.json")
            unk_tokenizer(os.path.join(SHARED, "tokenizers", "llama2", "tokenizer.json"), path, fuse)
            rows = encode_rows(Tokenizer.from_file(path), UNK_TEXTS)
            dump(os.path.join(OUT, "llama2_unk_%s.jsonl" % ("fused" if fuse else "unfused")), rows)
    print("corpus: %d texts" % len(corpus))


if __name__ == "__main__":
    main()

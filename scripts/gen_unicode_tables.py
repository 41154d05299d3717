#!/usr/bin/env python3
"""Generate runtime/tokenizer_unicode_tables.c: the Unicode data the tokenizer
runtime needs, made to agree code point for code point with HuggingFace
`tokenizers`, whose results kiln must reproduce exactly.

    python3 scripts/gen_unicode_tables.py > runtime/tokenizer_unicode_tables.c

Why not Python's unicodedata alone: its version (Unicode 14.0 in Python 3.11)
is not the one inside HF's engines. HF's regex engine (Oniguruma) knows about
9,000 letters newer than Unicode 14 (CJK extensions H and I, ...), and HF's
NFC (the unicode-normalization-alignments crate) is older than Unicode 14: it
gives no combining class to ~100 recent marks and does not compose U+11935
U+11930. So the candidates and values come from unicodedata, and HF's own
engines decide membership:

  character classes  \\p{L}, \\p{N} and \\s as HF's Split regex matches them:
                     every code point is run through a tokenizers Split
                     pre-tokenizer with that regex (behavior "removed");
  contraction folds  which characters (?i:'s|'t|...) accepts for each letter
                     (HF's case folding: 's' also matches U+017F);
  NFC                canonical combining classes of the marks HF's NFC
                     reorders; full canonical decompositions as HF's NFD
                     gives them; primary composites HF's NFC composes.

Tables (sorted by code point; searched by binary search unless noted):
  kiln_uni_class_stage1[0x1100], kiln_uni_class_blocks[][256]
                       two-level table of class bits per code point
                       (KILN_UNI_L 1, KILN_UNI_N 2, KILN_UNI_WS 4)
  kiln_uni_fold[]      {cp, ascii letter}: non-ASCII characters the
                       contraction alternatives accept case-insensitively
  kiln_uni_ccc[]       {first, last, ccc}: ranges of non-zero combining class
  kiln_uni_decomp[]    {cp, offset, length}: full canonical decomposition
                       (recursive), code points in kiln_uni_decomp_pool[];
                       Hangul syllables are decomposed algorithmically
  kiln_uni_comp[]      {first, second, composite}: primary composites, sorted
                       by (first, second); Hangul is algorithmic
  kiln_uni_nfc_qc[]    {first, last, value}: 1 = NFC_Quick_Check No, 2 = Maybe
                       (conservative: from unicodedata, a superset of what
                       HF's older tables could change)
Deterministic; needs the `tokenizers` package (the version is recorded).
"""
import sys
import unicodedata as ud

import tokenizers
from tokenizers import normalizers, pre_tokenizers, Regex

MAX = 0x110000
CPS = [c for c in range(MAX) if not (0xD800 <= c <= 0xDFFF)]
HANGUL_S = (0xAC00, 0xD7A3)


def hf_class(pattern):
    """Code points HF's Split regex `pattern` matches (each on its own)."""
    pt = pre_tokenizers.Split(Regex(pattern), "removed")
    kept = set()
    step = 65536
    for i in range(0, len(CPS), step):
        s = "".join(chr(c) for c in CPS[i:i + step])
        for piece, _ in pt.pre_tokenize_str(s):
            kept.update(ord(ch) for ch in piece)
    return set(CPS) - kept


def hf_folds():
    out = {}
    for letter in "strevmld":
        pt = pre_tokenizers.Split(Regex("(?i:'" + letter + ")"), "removed")
        cands = [c for c in CPS if c != 0x27 and c != 0x7C]
        s = "|".join("'" + chr(c) for c in cands)
        kept = set()
        for piece, _ in pt.pre_tokenize_str(s):
            kept.update(ord(ch) for ch in piece)
        hits = [c for c in cands if c not in kept]
        ascii_hits = sorted(c for c in hits if c < 0x80)
        assert ascii_hits == sorted([ord(letter), ord(letter.upper())]), (letter, ascii_hits)
        for c in hits:
            if c >= 0x80:
                out[c] = letter
    return out


def ranges(values):
    """[(first, last, value)] for runs of equal non-zero value; values: dict cp → value."""
    out = []
    start, cur = None, 0
    for c in range(MAX + 1):
        v = values.get(c, 0) if c < MAX else 0
        if v != cur:
            if cur:
                out.append((start, c - 1, cur))
            start, cur = c, v
    return out


def main():
    w = sys.stdout.write
    L, N, WS = hf_class(r"\p{L}"), hf_class(r"\p{N}"), hf_class(r"\s")
    assert not (L & N) and not (L & WS) and not (N & WS)
    folds = hf_folds()

    nfc, nfd = normalizers.NFC(), normalizers.NFD()
    # combining classes: a mark keeps its class when HF's NFC reorders it as
    # Python's does (against U+0334, class 1, or U+0301, class 230)
    ccc = {}
    for c in CPS:
        k = ud.combining(chr(c))
        if k:
            probe = "a" + chr(c) + "\u0334" if k > 1 else "a\u0301" + chr(c)
            if nfc.normalize_str(probe) == ud.normalize("NFC", probe):
                ccc[c] = k
    # decompositions as HF's NFD gives them
    decomp = []
    for c in CPS:
        if HANGUL_S[0] <= c <= HANGUL_S[1] or c < 0xC0:
            continue
        d = nfd.normalize_str(chr(c))
        if d != chr(c):
            decomp.append((c, [ord(x) for x in d]))
    # primary composites HF composes
    comp = []
    for c in CPS:
        if HANGUL_S[0] <= c <= HANGUL_S[1]:
            continue
        d = ud.decomposition(chr(c))
        if not d or d.startswith("<"):
            continue
        parts = [int(x, 16) for x in d.split()]
        if len(parts) == 2 and nfc.normalize_str(chr(parts[0]) + chr(parts[1])) == chr(c):
            comp.append((parts[0], parts[1], c))
    comp.sort()
    seconds = {s for (_, s, _) in comp}
    seconds.update(range(0x1161, 0x1176))  # Hangul V jamo
    seconds.update(range(0x11A8, 0x11C3))  # Hangul T jamo
    qc = {}
    for c in CPS:
        if ud.normalize("NFC", chr(c)) != chr(c) or nfc.normalize_str(chr(c)) != chr(c):
            qc[c] = 1
        elif c in seconds:
            qc[c] = 2

    # two-level class table
    cls = bytearray(MAX)
    for c in L:
        cls[c] |= 1
    for c in N:
        cls[c] |= 2
    for c in WS:
        cls[c] |= 4
    blocks, index, stage1 = [], {}, []
    for b in range(MAX // 256):
        blk = bytes(cls[b * 256:(b + 1) * 256])
        if blk not in index:
            index[blk] = len(blocks)
            blocks.append(blk)
        stage1.append(index[blk])

    w("/*\n * tokenizer_unicode_tables.c — GENERATED by scripts/gen_unicode_tables.py: Unicode data\n")
    w(" * from Python's unicodedata (Unicode %s), membership decided by HuggingFace\n" % ud.unidata_version)
    w(" * tokenizers %s's own regex and normalizer engines. Do not edit by hand; the\n" % tokenizers.__version__)
    w(" * script says what each table holds and why.\n */\n")
    w('#include "tokenizer_internal.h"\n\n')
    w('const char kiln_uni_version[] = "unicodedata %s, tokenizers %s";\n\n' % (ud.unidata_version, tokenizers.__version__))

    w("/* %d letters (\\p{L}), %d numbers (\\p{N}), %d spaces (\\s) */\n" % (len(L), len(N), len(WS)))
    w("const uint16_t kiln_uni_class_stage1[%d] = {\n" % len(stage1))
    for i in range(0, len(stage1), 16):
        w("    " + ", ".join(str(x) for x in stage1[i:i + 16]) + ",\n")
    w("};\n")
    w("const uint8_t kiln_uni_class_blocks[%d][256] = {\n" % len(blocks))
    for blk in blocks:
        w("    {" + ",".join(str(x) for x in blk) + "},\n")
    w("};\n\n")

    w("const kiln_uni_fold_entry kiln_uni_fold[] = {\n")
    for c in sorted(folds):
        w("    {0x%X, '%s'},\n" % (c, folds[c]))
    w("};\nconst uint32_t kiln_uni_fold_count = %d;\n\n" % len(folds))

    cr = ranges(ccc)
    w("const kiln_uni_range kiln_uni_ccc[] = {\n")
    for a, b, v in cr:
        w("    {0x%X, 0x%X, %d},\n" % (a, b, v))
    w("};\nconst uint32_t kiln_uni_ccc_count = %d;\n\n" % len(cr))

    pool = []
    w("const kiln_uni_decomp_entry kiln_uni_decomp[] = {\n")
    for c, seq in decomp:
        w("    {0x%X, %d, %d},\n" % (c, len(pool), len(seq)))
        pool.extend(seq)
    w("};\nconst uint32_t kiln_uni_decomp_count = %d;\n" % len(decomp))
    w("const uint32_t kiln_uni_decomp_pool[] = {\n")
    for i in range(0, len(pool), 8):
        w("    " + ", ".join("0x%X" % x for x in pool[i:i + 8]) + ",\n")
    w("};\n\n")

    w("const kiln_uni_comp_entry kiln_uni_comp[] = {\n")
    for a, b, c in comp:
        w("    {0x%X, 0x%X, 0x%X},\n" % (a, b, c))
    w("};\nconst uint32_t kiln_uni_comp_count = %d;\n\n" % len(comp))

    qr = ranges(qc)
    w("const kiln_uni_range kiln_uni_nfc_qc[] = {\n")
    for a, b, v in qr:
        w("    {0x%X, 0x%X, %d},\n" % (a, b, v))
    w("};\nconst uint32_t kiln_uni_nfc_qc_count = %d;\n" % len(qr))


if __name__ == "__main__":
    main()

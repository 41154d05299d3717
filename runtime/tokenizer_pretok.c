/*
 * tokenizer_pretok.c — the Split pre-tokenizer's regexes.
 *
 * HF runs them in Oniguruma. kiln recognizes the patterns of the common BPE
 * families by their exact text and matches them with the code below, which
 * follows the backtracking order of each alternative, over character classes
 * taken from HF's own engine (tokenizer_unicode_tables.c) — so the pieces
 * are HF's for every code point, and matching costs a table lookup per
 * character. Other patterns run in PCRE2 after kiln_tok_rx_to_pcre2 has
 * made \s mean what Oniguruma means; there, \p{L} and \p{N} follow PCRE2's
 * Unicode version (docs/tokenizer.md).
 *
 * The known patterns (alternatives tried left to right at each position;
 * the first that matches wins, the search moves on after it):
 *
 *   LLAMA3 / QWEN2
 *     1 (?i:'s|'t|'re|'ve|'m|'ll|'d)
 *     2 [^\r\n\p{L}\p{N}]?\p{L}+
 *     3 \p{N}{1,3}                       (QWEN2: \p{N})
 *     4  ?[^\s\p{L}\p{N}]+[\r\n]*
 *     5 \s*[\r\n]+
 *     6 \s+(?!\S)
 *     7 \s+
 *   GPT2
 *     1 's|'t|'re|'ve|'m|'ll|'d  2  ?\p{L}+  3  ?\p{N}+  4  ?[^\s\p{L}\p{N}]+
 *     5 \s+(?!\S)  6 \s+
 */
#include <stdio.h>
#include <string.h>

#include "tokenizer_internal.h"

static const char kLlama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
static const char kQwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

int kiln_tok_rx_known(const uint8_t *pat, size_t len) {
    struct {
        const char *p;
        int kind;
    } known[] = {{kLlama3, KILN_TOK_RX_LLAMA3}, {kQwen2, KILN_TOK_RX_QWEN2}, {KILN_TOK_GPT2_REGEX, KILN_TOK_RX_GPT2}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strlen(known[i].p) == len && memcmp(known[i].p, pat, len) == 0) return known[i].kind;
    return KILN_TOK_RX_PCRE2;
}

/* ---- matching ---- */

/* One character at p[i] (valid UTF-8): its code point and class. */
typedef struct ch {
    uint32_t cp;
    unsigned cls; /* KILN_UNI_* bits */
    size_t len;   /* bytes; 0 at the end of the text */
} ch;

static inline ch char_at(const uint8_t *p, size_t n, size_t i) {
    ch c = {0, 0, 0};
    if (i >= n) return c;
    if (p[i] < 0x80) {
        c.cp = p[i];
        c.len = 1;
    } else {
        c.cp = kiln_utf8_decode(p + i, n - i, &c.len);
    }
    c.cls = kiln_uni_class(c.cp);
    return c;
}

static inline bool is_other(ch c) { return c.len && !(c.cls & (KILN_UNI_L | KILN_UNI_N | KILN_UNI_WS)); }
static inline bool is_crlf(ch c) { return c.len && (c.cp == '\r' || c.cp == '\n'); }

/* End of the run of characters whose class has any of `bits`, from i. */
static size_t run_of(const uint8_t *p, size_t n, size_t i, unsigned bits) {
    for (;;) {
        ch c = char_at(p, n, i);
        if (!c.len || !(c.cls & bits)) return i;
        i += c.len;
    }
}

static size_t run_other(const uint8_t *p, size_t n, size_t i) {
    for (;;) {
        ch c = char_at(p, n, i);
        if (!is_other(c)) return i;
        i += c.len;
    }
}

/* The lowercase ASCII letter a character stands for in a contraction, or 0. */
static char fold(ch c, bool caseless) {
    if (!c.len) return 0;
    if (c.cp < 0x80) {
        char l = (char)c.cp;
        if (caseless && l >= 'A' && l <= 'Z') l = (char)(l - 'A' + 'a');
        return l;
    }
    if (!caseless) return 0;
    for (uint32_t k = 0; k < kiln_uni_fold_count; k++)
        if (kiln_uni_fold[k].cp == c.cp) return kiln_uni_fold[k].letter;
    return 0;
}

/* 's 't 're 've 'm 'll 'd at i (p[i] is the apostrophe): end, or i. */
static size_t contraction(const uint8_t *p, size_t n, size_t i, bool caseless) {
    ch a = char_at(p, n, i + 1);
    char fa = fold(a, caseless);
    if (fa == 's' || fa == 't' || fa == 'm' || fa == 'd') return i + 1 + a.len;
    if (fa == 'r' || fa == 'v' || fa == 'l') {
        ch b = char_at(p, n, i + 1 + a.len);
        char fb = fold(b, caseless);
        if ((fa == 'l' && fb == 'l') || (fa != 'l' && fb == 'e')) return i + 1 + a.len + b.len;
    }
    return i;
}

/* \s+(?!\S) then \s+, for a whitespace run [i, j): end, or i. */
static size_t spaces(const uint8_t *p, size_t n, size_t i, size_t j) {
    if (j == n) return j; /* nothing after: (?!\S) holds at the end */
    /* back off one character so the next is not \S (it is the last space) */
    size_t k = j - 1;
    while (k > i && (p[k] & 0xC0) == 0x80) k--;
    if (k > i) return k;
    return j;             /* a single space before \S: alternative 7 (\s+) */
}

static size_t match_llama3(const uint8_t *p, size_t n, size_t i, int max_digits) {
    ch c0 = char_at(p, n, i);
    /* 1 */
    if (c0.cp == '\'') {
        size_t e = contraction(p, n, i, true);
        if (e > i) return e;
    }
    /* 2 */
    if (c0.cls & KILN_UNI_L) return run_of(p, n, i, KILN_UNI_L);
    if (!(c0.cls & (KILN_UNI_L | KILN_UNI_N)) && c0.cp != '\r' && c0.cp != '\n') {
        ch c1 = char_at(p, n, i + c0.len);
        if (c1.cls & KILN_UNI_L) return run_of(p, n, i + c0.len, KILN_UNI_L);
    }
    /* 3 */
    if (c0.cls & KILN_UNI_N) {
        size_t e = i;
        for (int k = 0; k < max_digits; k++) {
            ch c = char_at(p, n, e);
            if (!(c.cls & KILN_UNI_N)) break;
            e += c.len;
        }
        return e;
    }
    /* 4 */
    {
        size_t j = i;
        if (c0.cp == ' ' && is_other(char_at(p, n, i + 1))) j = i + 1;
        if (j > i || is_other(c0)) {
            size_t e = run_other(p, n, j);
            for (ch c = char_at(p, n, e); is_crlf(c); c = char_at(p, n, e)) e += c.len;
            return e;
        }
    }
    if (c0.cls & KILN_UNI_WS) {
        size_t j = run_of(p, n, i, KILN_UNI_WS);
        /* 5: up to the last \r or \n of the run */
        size_t last = i;
        for (size_t k = i; k < j;) {
            ch c = char_at(p, n, k);
            k += c.len;
            if (is_crlf(c)) last = k;
        }
        if (last > i) return last;
        /* 6, 7 */
        return spaces(p, n, i, j);
    }
    return i;
}

static size_t match_gpt2(const uint8_t *p, size_t n, size_t i) {
    ch c0 = char_at(p, n, i);
    if (c0.cp == '\'') {
        size_t e = contraction(p, n, i, false);
        if (e > i) return e;
    }
    size_t j = i;
    ch c = c0;
    if (c0.cp == ' ') { /* the optional space of alternatives 2-4 */
        ch c1 = char_at(p, n, i + 1);
        if (c1.len && !(c1.cls & KILN_UNI_WS)) {
            j = i + 1;
            c = c1;
        }
    }
    if (c.cls & KILN_UNI_L) return run_of(p, n, j, KILN_UNI_L);
    if (c.cls & KILN_UNI_N) return run_of(p, n, j, KILN_UNI_N);
    if (is_other(c)) return run_other(p, n, j);
    if (c0.cls & KILN_UNI_WS) return spaces(p, n, i, run_of(p, n, i, KILN_UNI_WS));
    return i;
}

size_t kiln_tok_rx_match(int kind, const uint8_t *p, size_t n, size_t i) {
    switch (kind) {
    case KILN_TOK_RX_LLAMA3: return match_llama3(p, n, i, 3);
    case KILN_TOK_RX_QWEN2: return match_llama3(p, n, i, 1);
    case KILN_TOK_RX_GPT2: return match_gpt2(p, n, i);
    default: return i;
    }
}

/* ---- Oniguruma → PCRE2 ---- */

/* White_Space, the set Oniguruma's \s matches (PCRE2's \s adds U+180E). */
#define WS_SET "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

bool kiln_tok_rx_to_pcre2(const uint8_t *pat, size_t len, kiln_buf *out, char *why, size_t why_cap) {
    bool in_class = false;
    size_t class_start = 0; /* offset just after "[" or "[^" */
    for (size_t i = 0; i < len; i++) {
        uint8_t c = pat[i];
        if (c == '\\') {
            if (i + 1 >= len) {
                snprintf(why, why_cap, "a trailing backslash");
                return false;
            }
            uint8_t x = pat[++i];
            if (x == 's') {
                kiln_buf_printf(out, in_class ? WS_SET : "[" WS_SET "]");
            } else if (x == 'S' && !in_class) {
                kiln_buf_printf(out, "[^" WS_SET "]");
            } else if (strchr("SdDwWbBhHvVRXKNGAzZQEuUkgc", x) && x) {
                snprintf(why, why_cap, "\\%c at offset %zu (its meaning differs between Oniguruma and PCRE2)", x, i - 1);
                return false;
            } else {
                uint8_t e[2] = {'\\', x};
                kiln_buf_append(out, e, 2);
            }
            continue;
        }
        if (in_class) {
            if (c == '[' ) {
                snprintf(why, why_cap, "a '[' inside a character class at offset %zu (nested classes differ)", i);
                return false;
            }
            if (c == ']' && i > class_start) in_class = false;
        } else if (c == '[') {
            in_class = true;
            class_start = i + 1;
            if (i + 1 < len && pat[i + 1] == '^') class_start = i + 2;
        } else if (c == '^' || c == '$') {
            snprintf(why, why_cap, "'%c' at offset %zu (line anchors differ between Oniguruma and PCRE2)", c, i);
            return false;
        }
        kiln_buf_append(out, &c, 1);
    }
    if (in_class) {
        snprintf(why, why_cap, "an unterminated character class");
        return false;
    }
    if (out->failed) {
        snprintf(why, why_cap, "out of memory");
        return false;
    }
    return true;
}

kiln_status kiln_tok_rx_compile(const uint8_t *pat, size_t len, pcre2_code **out, kiln_error *err) {
    *out = NULL;
    kiln_buf tr = {0};
    char why[160];
    if (!kiln_tok_rx_to_pcre2(pat, len, &tr, why, sizeof why)) {
        kiln_buf_free(&tr);
        return kiln_err(err, KILN_ERR_UNSUPPORTED, "the Split regex cannot be run exactly: %s", why);
    }
    int code;
    PCRE2_SIZE off;
    *out = pcre2_compile((PCRE2_SPTR)tr.data, tr.len, PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &code, &off, NULL);
    kiln_buf_free(&tr);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return kiln_err(err, KILN_ERR_UNSUPPORTED, "the Split regex does not compile in PCRE2 (near offset %zu): %s", (size_t)off,
                        (const char *)msg);
    }
    (void)pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE); /* the interpreter runs it when JIT is unavailable */
    return KILN_OK;
}

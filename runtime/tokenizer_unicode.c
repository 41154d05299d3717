/*
 * tokenizer_unicode.c — UTF-8 validation/decoding, Rust-compatible lossy
 * conversion, the GPT-2 byte↔char table, and NFC over the generated tables
 * (tokenizer_unicode_tables.c).
 *
 * NFC follows UAX #15: full canonical decomposition (Hangul algorithmic),
 * canonical ordering (stable sort of combining marks by class), then
 * canonical composition of unblocked pairs. A quick check skips the work for
 * text that is certainly NFC already (almost all text), which is what keeps
 * qwen3's encoder fast.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

/* ---- UTF-8 ---- */

int kiln_utf8_lead_len(uint8_t b) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

/* The valid range of the second byte after lead byte b (the later ones are 80..BF). */
static void second_range(uint8_t b, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (b == 0xE0) *lo = 0xA0;
    else if (b == 0xED) *hi = 0x9F;
    else if (b == 0xF0) *lo = 0x90;
    else if (b == 0xF4) *hi = 0x8F;
}

/* One step over p[0..n): returns 1 with *len = character length when a
 * valid character starts at p; 0 with *len = length of the maximal invalid
 * subpart (≥ 1); 2 with *len = n when p is a valid but unfinished prefix. */
static int utf8_step(const uint8_t *p, size_t n, size_t *len) {
    uint8_t b = p[0];
    int need = kiln_utf8_lead_len(b);
    if (need == 1) {
        *len = 1;
        return 1;
    }
    if (need == 0) {
        *len = 1;
        return 0;
    }
    uint8_t lo, hi;
    second_range(b, &lo, &hi);
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) {
            *len = n;
            return 2;
        }
        uint8_t c = p[i];
        if (i == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) {
            *len = (size_t)i;
            return 0;
        }
    }
    *len = (size_t)need;
    return 1;
}

size_t kiln_utf8_valid_prefix(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t len;
        if (utf8_step(p + i, n - i, &len) != 1) return i;
        i += len;
    }
    return n;
}

uint32_t kiln_utf8_decode(const uint8_t *p, size_t n, size_t *len) {
    uint8_t b = p[0];
    if (b < 0x80 || n < 2) {
        *len = 1;
        return b;
    }
    if (b < 0xE0) {
        *len = 2;
        return (uint32_t)(b & 0x1F) << 6 | (p[1] & 0x3F);
    }
    if (b < 0xF0 || n < 4) {
        *len = 3;
        return (uint32_t)(b & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    }
    *len = 4;
    return (uint32_t)(b & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 | (uint32_t)(p[2] & 0x3F) << 6 |
           (p[3] & 0x3F);
}

size_t kiln_utf8_encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

static const uint8_t kFFFD[3] = {0xEF, 0xBF, 0xBD};

bool kiln_utf8_lossy_append(kiln_buf *out, const uint8_t *p, size_t n) {
    size_t i = 0, run = 0; /* p[run..i) is valid and not yet appended */
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t len;
        int st = utf8_step(p + i, n - i, &len);
        if (st == 1) {
            i += len;
            continue;
        }
        if (!kiln_buf_append(out, p + run, i - run) || !kiln_buf_append(out, kFFFD, 3)) return false;
        i += len;
        run = i;
    }
    return kiln_buf_append(out, p + run, n - run);
}

/* ---- GPT-2 byte-level alphabet ----
 * Bytes that are printable (! .. ~, ¡ .. ¬, ® .. ÿ) stand for themselves;
 * the other 68 map, in increasing order, to U+0100 .. U+0143. */

static bool bytelevel_self(uint32_t b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t kiln_bytelevel_char(uint8_t b) {
    if (bytelevel_self(b)) return b;
    if (b <= 0x20) return 0x100u + b;                     /* 0x00..0x20 → U+0100..U+0120 */
    if (b >= 0x7F && b <= 0xA0) return 0x121u + (b - 0x7Fu); /* 0x7F..0xA0 → U+0121..U+0142 */
    return 0x143u;                                        /* 0xAD */
}

int kiln_bytelevel_byte(uint32_t cp) {
    if (cp < 0x100) return bytelevel_self(cp) ? (int)cp : -1;
    if (cp <= 0x120) return (int)(cp - 0x100);
    if (cp <= 0x142) return (int)(0x7F + cp - 0x121);
    if (cp == 0x143) return 0xAD;
    return -1;
}

/* ---- Unicode properties ---- */

static uint32_t range_lookup(const kiln_uni_range *r, uint32_t count, uint32_t cp) {
    uint32_t lo = 0, hi = count;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (cp < r[mid].first) hi = mid;
        else if (cp > r[mid].last) lo = mid + 1;
        else return r[mid].value;
    }
    return 0;
}

static uint32_t ccc_of(uint32_t cp) {
    if (cp < 0x300) return 0;
    return range_lookup(kiln_uni_ccc, kiln_uni_ccc_count, cp);
}

static uint32_t nfc_qc_of(uint32_t cp) {
    if (cp < 0x300) return 0;
    return range_lookup(kiln_uni_nfc_qc, kiln_uni_nfc_qc_count, cp);
}

bool kiln_uni_nfc_quick(const uint8_t *p, size_t n) {
    uint32_t last_ccc = 0;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0xCC) { /* below U+0300: class 0, quick check Yes */
            i += p[i] < 0x80 ? 1 : 2; /* C2..CB lead two-byte characters */
            last_ccc = 0;
            continue;
        }
        size_t len;
        uint32_t cp = kiln_utf8_decode(p + i, n - i, &len);
        i += len;
        if (nfc_qc_of(cp) != 0) return false;
        uint32_t c = ccc_of(cp);
        if (c != 0 && last_ccc > c) return false;
        last_ccc = c;
    }
    return true;
}

/* Hangul syllable algorithm constants (Unicode §3.12). */
enum {
    H_SBASE = 0xAC00, H_LBASE = 0x1100, H_VBASE = 0x1161, H_TBASE = 0x11A7,
    H_LCOUNT = 19, H_VCOUNT = 21, H_TCOUNT = 28, H_NCOUNT = 588, H_SCOUNT = 11172,
};

static const kiln_uni_decomp_entry *decomp_of(uint32_t cp) {
    uint32_t lo = 0, hi = kiln_uni_decomp_count;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (kiln_uni_decomp[mid].cp < cp) lo = mid + 1;
        else if (kiln_uni_decomp[mid].cp > cp) hi = mid;
        else return &kiln_uni_decomp[mid];
    }
    return NULL;
}

static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= H_LBASE && a < H_LBASE + H_LCOUNT && b >= H_VBASE && b < H_VBASE + H_VCOUNT)
        return H_SBASE + ((a - H_LBASE) * H_VCOUNT + (b - H_VBASE)) * H_TCOUNT;
    if (a >= H_SBASE && a < H_SBASE + H_SCOUNT && (a - H_SBASE) % H_TCOUNT == 0 && b > H_TBASE &&
        b < H_TBASE + H_TCOUNT)
        return a + (b - H_TBASE);
    uint32_t lo = 0, hi = kiln_uni_comp_count;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        const kiln_uni_comp_entry *e = &kiln_uni_comp[mid];
        if (e->first < a || (e->first == a && e->second < b)) lo = mid + 1;
        else if (e->first == a && e->second == b) return e->composite;
        else hi = mid;
    }
    return 0;
}

bool kiln_uni_nfc(const uint8_t *p, size_t n, kiln_buf *out) {
    if (kiln_uni_nfc_quick(p, n)) return kiln_buf_append(out, p, n);

    /* 1. decompose; a character expands to at most 4 code points */
    uint64_t cap64;
    if (!kiln_mul_u64(n, 4 * sizeof(uint32_t), &cap64) || cap64 > SIZE_MAX) return false;
    uint32_t *cp = malloc((size_t)cap64 + 1);
    if (!cp) return false;
    size_t m = 0, i = 0;
    while (i < n) {
        size_t len;
        uint32_t c = kiln_utf8_decode(p + i, n - i, &len);
        i += len;
        if (c >= H_SBASE && c < H_SBASE + H_SCOUNT) {
            uint32_t s = c - H_SBASE;
            cp[m++] = H_LBASE + s / H_NCOUNT;
            cp[m++] = H_VBASE + (s % H_NCOUNT) / H_TCOUNT;
            if (s % H_TCOUNT) cp[m++] = H_TBASE + s % H_TCOUNT;
            continue;
        }
        const kiln_uni_decomp_entry *d = c >= 0xC0 ? decomp_of(c) : NULL;
        if (d) {
            for (uint32_t k = 0; k < d->length; k++) cp[m++] = kiln_uni_decomp_pool[d->offset + k];
        } else {
            cp[m++] = c;
        }
    }

    /* 2. canonical ordering: stable insertion sort of each run of non-starters */
    for (size_t k = 1; k < m; k++) {
        uint32_t c = cp[k], cc = ccc_of(c);
        if (cc == 0) continue;
        size_t j = k;
        while (j > 0) {
            uint32_t pc = ccc_of(cp[j - 1]);
            if (pc == 0 || pc <= cc) break;
            cp[j] = cp[j - 1];
            j--;
        }
        cp[j] = c;
    }

    /* 3. canonical composition */
    if (m > 0) {
        size_t starter_pos = 0, w = 1;
        uint32_t starter = cp[0];
        uint32_t last_class = ccc_of(starter) ? 256 : 0; /* a leading non-starter blocks everything */
        for (size_t k = 1; k < m; k++) {
            uint32_t c = cp[k], cls = ccc_of(c);
            uint32_t comp = compose_pair(starter, c);
            if (comp && (last_class < cls || last_class == 0)) {
                cp[starter_pos] = comp;
                starter = comp;
                continue;
            }
            if (cls == 0) {
                starter_pos = w;
                starter = c;
            }
            last_class = cls;
            cp[w++] = c;
        }
        m = w;
    }

    bool ok = kiln_buf_reserve(out, m * 4);
    for (size_t k = 0; ok && k < m; k++) {
        uint8_t u[4];
        ok = kiln_buf_append(out, u, kiln_utf8_encode(cp[k], u));
    }
    free(cp);
    return ok;
}

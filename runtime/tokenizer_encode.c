/*
 * tokenizer_encode.c — text → ids, in HF `tokenizers`' order:
 *
 *   1. split the input on added tokens whose `normalized` is false
 *      (leftmost-longest; lstrip/rstrip swallow whitespace; with
 *      KILN_TOK_NO_SPECIAL special ones are skipped, as
 *      encode_special_tokens=True does);
 *   2. normalize each remaining piece on its own (Prepend, Replace, NFC) —
 *      so llama2's "▁" is prepended to every piece between added tokens;
 *   3. split normalized pieces on added tokens whose `normalized` is true;
 *   4. pre-tokenize: each Split regex cuts pieces into matches and the gaps
 *      between them (known patterns: tokenizer_pretok.c's matcher; others:
 *      PCRE2, UTF+UCP, JIT); ByteLevel makes words raw bytes;
 *   5. BPE each word: ignore_merges whole-word lookup, then initial symbols
 *      (characters, or bytes; byte_fallback <0xNN>; unk), then merges by
 *      rank, leftmost first among equal ranks. Short words use a linear
 *      scan over cached pair ranks; long ones (runs of one character) a
 *      binary heap with lazy deletion, exactly HF's Word::merge_all;
 *   6. with KILN_TOK_ADD_SPECIAL, the post-processor's prefix/suffix ids.
 *
 * All scratch lives in one per-call struct; the tokenizer is read-only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

#define BPE_SMALL 48 /* words up to this many symbols merge by linear scan */

typedef struct sym {
    int32_t id;
    int32_t prev, next; /* neighbours among live symbols, -1 at the ends */
    uint32_t len;       /* bytes covered; 0 = merged away */
} sym;

typedef struct heap_item {
    uint64_t key;   /* rank << 32 | position: the smallest pops first */
    int32_t new_id;
} heap_item;

typedef struct enc {
    const kiln_tokenizer *t;
    unsigned flags;
    kiln_error *err;
    kiln_status st;
    /* output */
    int32_t *ids;
    size_t n, cap;
    /* scratch */
    kiln_buf norm, tmp;
    sym *syms;
    size_t syms_cap;
    uint32_t *rank;     /* BPE_SMALL: rank of the pair starting at each symbol */
    int32_t *rank_new;
    heap_item *heap;
    size_t heap_cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
} enc;

static bool push_id(enc *e, int32_t id) {
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 256;
        int32_t *p = realloc(e->ids, cap * sizeof *p);
        if (!p) {
            e->st = kiln_err(e->err, KILN_ERR_NOMEM, "tokenizer: out of memory for %zu ids", cap);
            return false;
        }
        e->ids = p;
        e->cap = cap;
    }
    e->ids[e->n++] = id;
    return true;
}

static bool fail_nomem(enc *e, const char *what) {
    e->st = kiln_err(e->err, KILN_ERR_NOMEM, "tokenizer: out of memory (%s)", what);
    return false;
}

/* ---- normalizer ---- */

static bool replace_all(kiln_buf *out, const uint8_t *p, size_t n, const uint8_t *a, size_t la,
                        const uint8_t *b, size_t lb) {
    size_t i = 0;
    while (i < n) {
        const uint8_t *hit = la <= n - i ? memmem(p + i, n - i, a, la) : NULL;
        if (!hit) break;
        size_t at = (size_t)(hit - p);
        if (!kiln_buf_append(out, p + i, at - i) || !kiln_buf_append(out, b, lb)) return false;
        i = at + la;
    }
    return kiln_buf_append(out, p + i, n - i);
}

/* Normalize p[0..n) into *out (cleared first); `tmp` is scratch. */
kiln_status kiln_tok_normalize(const kiln_tokenizer *t, const uint8_t *p, size_t n, kiln_buf *out, kiln_buf *tmp) {
    out->len = 0;
    if (!kiln_buf_append(out, p, n)) return KILN_ERR_NOMEM;
    for (uint32_t i = 0; i < t->n_norm; i++) {
        const tok_step *s = &t->norm[i];
        tmp->len = 0;
        bool ok = true;
        switch (s->kind) {
        case KILN_TOK_NORM_PREPEND:
            if (out->len == 0) continue;
            ok = kiln_buf_append(tmp, tok_bytes(t, s->a), s->a.len) && kiln_buf_append(tmp, out->data, out->len);
            break;
        case KILN_TOK_NORM_REPLACE:
            if (!memmem(out->data, out->len, tok_bytes(t, s->a), s->a.len)) continue;
            ok = replace_all(tmp, out->data, out->len, tok_bytes(t, s->a), s->a.len, tok_bytes(t, s->b), s->b.len);
            break;
        case KILN_TOK_NORM_NFC:
            if (kiln_uni_nfc_quick(out->data, out->len)) continue;
            ok = kiln_uni_nfc(out->data, out->len, tmp);
            break;
        default:
            continue;
        }
        if (!ok) return KILN_ERR_NOMEM;
        kiln_buf sw = *out;
        *out = *tmp;
        *tmp = sw;
    }
    return KILN_OK;
}

/* ---- BPE ---- */

static inline bool merge_get(const tok_mergemap *m, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t s = kiln_tok_merge_slot(m, key);; s = (s + 1) & m->mask) {
        const tok_merge_slot *sl = &m->slots[s];
        if (sl->key == key) {
            *rank = sl->rank;
            *new_id = sl->merged;
            return true;
        }
        if (sl->key == UINT64_MAX) return false;
    }
}

static bool syms_reserve(enc *e, size_t n) {
    if (n <= e->syms_cap) return true;
    size_t cap = e->syms_cap ? e->syms_cap : 64;
    while (cap < n) cap *= 2;
    sym *s = realloc(e->syms, cap * sizeof *s);
    if (!s) return fail_nomem(e, "BPE symbols");
    e->syms = s;
    e->syms_cap = cap;
    return true;
}

static void sym_add(enc *e, size_t *m, int32_t id, uint32_t len) {
    sym *s = &e->syms[*m];
    s->id = id;
    s->len = len;
    s->prev = (int32_t)*m - 1;
    s->next = -1;
    if (*m > 0) e->syms[*m - 1].next = (int32_t)*m;
    (*m)++;
}

static void heap_push(heap_item *h, size_t *n, heap_item x) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].key <= x.key) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static heap_item heap_pop(heap_item *h, size_t *n) {
    heap_item top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1].key < h[c].key) c++;
        if (last.key <= h[c].key) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Merge symbols [0, m) as HF's Word::merge_all; live symbols remain linked from index 0. */
static bool merge_heap(enc *e, size_t m) {
    const tok_mergemap *mm = &e->t->merges;
    sym *s = e->syms;
    if (m > e->heap_cap) {
        heap_item *h = realloc(e->heap, m * 2 * sizeof *h);
        if (!h) return fail_nomem(e, "BPE heap");
        e->heap = h;
        e->heap_cap = m * 2;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < m; i++) {
        uint32_t r;
        int32_t nid;
        if (merge_get(mm, s[i].id, s[i + 1].id, &r, &nid))
            heap_push(e->heap, &hn, (heap_item){(uint64_t)r << 32 | i, nid});
    }
    while (hn) {
        heap_item top = heap_pop(e->heap, &hn);
        size_t pos = (uint32_t)top.key;
        if (s[pos].len == 0 || s[pos].next < 0) continue;
        size_t nx = (size_t)s[pos].next;
        uint32_t r;
        int32_t nid;
        if (!merge_get(mm, s[pos].id, s[nx].id, &r, &nid) || nid != top.new_id) continue; /* stale */
        s[pos].id = nid;
        s[pos].len += s[nx].len;
        s[pos].next = s[nx].next;
        s[nx].len = 0;
        if (s[nx].next >= 0) s[s[nx].next].prev = (int32_t)pos;
        /* the heap can hold at most one entry per pair creation: grow if needed */
        if (hn + 2 > e->heap_cap) {
            heap_item *h = realloc(e->heap, e->heap_cap * 2 * sizeof *h);
            if (!h) return fail_nomem(e, "BPE heap");
            e->heap = h;
            e->heap_cap *= 2;
        }
        if (s[pos].prev >= 0 && merge_get(mm, s[s[pos].prev].id, s[pos].id, &r, &nid))
            heap_push(e->heap, &hn, (heap_item){(uint64_t)r << 32 | (uint32_t)s[pos].prev, nid});
        if (s[pos].next >= 0 && merge_get(mm, s[pos].id, s[s[pos].next].id, &r, &nid))
            heap_push(e->heap, &hn, (heap_item){(uint64_t)r << 32 | pos, nid});
    }
    return true;
}

/* The same result for short words: the rank of each live pair is cached and
 * the smallest (leftmost on ties) is merged until none is left. */
static void merge_scan(enc *e, size_t m) {
    const tok_mergemap *mm = &e->t->merges;
    sym *s = e->syms;
    uint32_t *rank = e->rank;
    int32_t *nw = e->rank_new;
    for (size_t i = 0; i + 1 < m; i++)
        if (!merge_get(mm, s[i].id, s[i + 1].id, &rank[i], &nw[i])) rank[i] = UINT32_MAX;
    if (m) rank[m - 1] = UINT32_MAX;
    for (;;) {
        uint32_t best = UINT32_MAX;
        int32_t bi = -1;
        for (int32_t i = 0; i >= 0; i = s[i].next)
            if (rank[i] < best) {
                best = rank[i];
                bi = i;
            }
        if (bi < 0) break;
        int32_t nx = s[bi].next;
        s[bi].id = nw[bi];
        s[bi].len += s[nx].len;
        s[bi].next = s[nx].next;
        s[nx].len = 0;
        if (s[nx].next >= 0) s[s[nx].next].prev = bi;
        int32_t pv = s[bi].prev;
        if (pv >= 0 && !merge_get(mm, s[pv].id, s[bi].id, &rank[pv], &nw[pv])) rank[pv] = UINT32_MAX;
        if (s[bi].next < 0 || !merge_get(mm, s[bi].id, s[s[bi].next].id, &rank[bi], &nw[bi])) rank[bi] = UINT32_MAX;
    }
}

/* One pre-tokenized word → ids. */
static bool bpe_word(enc *e, const uint8_t *p, size_t n) {
    const kiln_tokenizer *t = e->t;
    if (n == 0) return true;
    bool bl = t->model_flags & KILN_TOK_MF_BYTE_LEVEL;
    if (t->model_flags & KILN_TOK_MF_IGNORE_MERGES) {
        int32_t id = kiln_tok_strmap_get(&t->vocab, t, t->vocab_key, p, n);
        if (id >= 0) return push_id(e, id);
    }
    if (n == 1 && bl && t->byte_sym[p[0]] >= 0) return push_id(e, t->byte_sym[p[0]]);
    if (!syms_reserve(e, n + 1)) return false;
    size_t m = 0;
    int32_t unk = -1;    /* pending unknown: HF adds it lazily so fuse_unk can extend it */
    uint32_t unk_len = 0;
    size_t i = 0;
    while (i < n) {
        size_t cl = 1;
        int32_t id;
        if (bl) {
            id = t->byte_sym[p[i]];
        } else {
            if (p[i] < 0x80) {
                id = t->ascii_id[p[i]];
            } else {
                kiln_utf8_decode(p + i, n - i, &cl);
                id = kiln_tok_strmap_get(&t->vocab, t, t->vocab_key, p + i, cl);
            }
        }
        if (id >= 0) {
            if (unk >= 0) {
                sym_add(e, &m, unk, unk_len);
                unk = -1;
            }
            sym_add(e, &m, id, (uint32_t)cl);
            i += cl;
            continue;
        }
        if (!bl && (t->model_flags & KILN_TOK_MF_BYTE_FALLBACK)) {
            bool all = true;
            for (size_t k = 0; k < cl; k++) all = all && t->byte_sym[p[i + k]] >= 0;
            if (all) { /* HF leaves a pending unk pending here */
                for (size_t k = 0; k < cl; k++) sym_add(e, &m, t->byte_sym[p[i + k]], 1);
                i += cl;
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk >= 0 && (t->model_flags & KILN_TOK_MF_FUSE_UNK)) {
                unk_len += (uint32_t)cl;
            } else {
                if (unk >= 0) sym_add(e, &m, unk, unk_len);
                unk = t->unk_id;
                unk_len = (uint32_t)cl;
            }
        } /* else: HF drops a character it cannot represent */
        i += cl;
    }
    if (unk >= 0) sym_add(e, &m, unk, unk_len);
    if (m == 0) return true;
    if (m <= BPE_SMALL) {
        merge_scan(e, m);
    } else if (!merge_heap(e, m)) {
        return false;
    }
    for (int32_t k = 0; k >= 0; k = e->syms[k].next)
        if (!push_id(e, e->syms[k].id)) return false;
    return true;
}

/* ---- pre-tokenizer ---- */

static bool pretok(enc *e, uint32_t step, const uint8_t *p, size_t n);

/* Run regex `re` over p[0..n): matches and the gaps between them become pieces. */
static bool split_regex(enc *e, uint32_t step, pcre2_code *re, const uint8_t *p, size_t n) {
    if (!e->md) {
        e->md = pcre2_match_data_create(4, NULL);
        if (!e->md) return fail_nomem(e, "regex match data");
    }
    size_t start = 0, prev = 0;
    while (start < n) {
        int rc = pcre2_match(re, p, n, start, PCRE2_NO_UTF_CHECK, e->md, e->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !e->jit_stack) {
            /* a long run needs more than the default 32 KiB JIT stack: give it up to 64 MiB and retry */
            e->mctx = pcre2_match_context_create(NULL);
            e->jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
            if (!e->mctx || !e->jit_stack) return fail_nomem(e, "regex JIT stack");
            pcre2_jit_stack_assign(e->mctx, NULL, e->jit_stack);
            continue;
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            e->st = kiln_err(e->err, KILN_ERR_TOKENIZER, "tokenizer: pre-tokenizer regex failed at byte %zu of a %zu-byte piece: %s",
                             start, n, (const char *)msg);
            return false;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (ms > prev && !pretok(e, step + 1, p + prev, ms - prev)) return false;
        if (me == ms) { /* an empty match splits here; move on by one character */
            prev = ms;
            size_t cl = 1;
            if (ms < n && p[ms] >= 0x80) kiln_utf8_decode(p + ms, n - ms, &cl);
            start = ms + cl;
            continue;
        }
        if (!pretok(e, step + 1, p + ms, me - ms)) return false;
        prev = start = me;
    }
    if (prev < n && !pretok(e, step + 1, p + prev, n - prev)) return false;
    return true;
}

/* A word for the model; cut at split_char boundaries first when the tokenizer allows it. */
static bool model_word(enc *e, const uint8_t *p, size_t n) {
    const kiln_tokenizer *t = e->t;
    size_t cl = t->split_char.len;
    if (cl == 0 || n <= cl) return bpe_word(e, p, n);
    const uint8_t *c = tok_bytes(t, t->split_char);
    size_t start = 0, i = 1;
    while (i + cl <= n) {
        const uint8_t *hit = memmem(p + i, n - i, c, cl);
        if (!hit) break;
        size_t at = (size_t)(hit - p);
        if (at < cl || memcmp(p + at - cl, c, cl) != 0) { /* after a different character: cut */
            if (!bpe_word(e, p + start, at - start)) return false;
            start = at;
        }
        i = at + cl;
    }
    return bpe_word(e, p + start, n - start);
}

/* A known pattern: the built-in matcher (tokenizer_pretok.c) finds the pieces. */
static bool split_known(enc *e, uint32_t step, int kind, const uint8_t *p, size_t n) {
    size_t i = 0, prev = 0;
    while (i < n) {
        size_t end = kiln_tok_rx_match(kind, p, n, i);
        if (end > i) {
            if (i > prev && !pretok(e, step + 1, p + prev, i - prev)) return false;
            if (!pretok(e, step + 1, p + i, end - i)) return false;
            prev = i = end;
        } else { /* no match here: this character is part of a gap */
            size_t cl = 1;
            if (p[i] >= 0x80) kiln_utf8_decode(p + i, n - i, &cl);
            i += cl;
        }
    }
    if (prev < n && !pretok(e, step + 1, p + prev, n - prev)) return false;
    return true;
}

static bool pretok(enc *e, uint32_t step, const uint8_t *p, size_t n) {
    const kiln_tokenizer *t = e->t;
    if (n == 0) return true;
    if (step == t->n_pre) return model_word(e, p, n);
    if (t->pre_rx[step] != KILN_TOK_RX_PCRE2) return split_known(e, step, t->pre_rx[step], p, n);
    if (t->pre_re[step]) return split_regex(e, step, t->pre_re[step], p, n);
    return pretok(e, step + 1, p, n); /* ByteLevel without regex: bytes are handled by the model */
}

/* ---- added tokens ---- */

/* Leftmost-longest match of m's patterns in p[from..n): returns the added index or -1, with *at. */
static int32_t find_added(const kiln_tokenizer *t, const tok_matcher *m, const uint8_t *p, size_t from, size_t n,
                          size_t *at) {
    if (m->n == 0) return -1;
    for (size_t i = from; i < n; i++) {
        uint32_t lo = m->first[p[i]], hi = m->first[p[i] + 1];
        for (uint32_t k = lo; k < hi; k++) { /* longest first */
            const tok_added *a = &t->added[m->order[k]];
            if (a->content.len <= n - i && memcmp(p + i, tok_bytes(t, a->content), a->content.len) == 0) {
                *at = i;
                return (int32_t)m->order[k];
            }
        }
    }
    return -1;
}

/* Whitespace (White_Space) at the end of p[0..n): returns where it starts. */
static size_t space_run_start(const uint8_t *p, size_t n) {
    size_t i = n;
    while (i > 0) {
        size_t k = i - 1;
        while (k > 0 && (p[k] & 0xC0) == 0x80) k--;
        size_t cl;
        if (!kiln_uni_is_space(kiln_utf8_decode(p + k, i - k, &cl))) break;
        i = k;
    }
    return i;
}

static size_t space_run_len(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t cl;
        if (!kiln_uni_is_space(kiln_utf8_decode(p + i, n - i, &cl))) break;
        i += cl;
    }
    return i;
}

typedef bool (*piece_fn)(enc *e, const uint8_t *p, size_t n);

/* HF AddedVocabulary::find_matches: cut p[0..n) at added tokens of matcher m;
 * gaps go to `gap`, tokens to the output. */
static bool split_added(enc *e, const tok_matcher *m, const uint8_t *p, size_t n, piece_fn gap) {
    const kiln_tokenizer *t = e->t;
    size_t start_offset = 0, pos = 0, at;
    int32_t k;
    while (pos < n && (k = find_added(t, m, p, pos, n, &at)) >= 0) {
        const tok_added *a = &t->added[k];
        size_t start = at, stop = at + a->content.len;
        pos = stop; /* the automaton goes on after the match, whatever is done with it */
        if ((e->flags & KILN_TOK_NO_SPECIAL) && (a->flags & KILN_TOK_AF_SPECIAL)) continue;
        if (a->flags & KILN_TOK_AF_LSTRIP) {
            size_t ns = space_run_start(p, start);
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->flags & KILN_TOK_AF_RSTRIP) stop += space_run_len(p + stop, n - stop);
        if (start_offset < start && !gap(e, p + start_offset, start - start_offset)) return false;
        if (!push_id(e, a->id)) return false;
        start_offset = stop;
    }
    if (start_offset < n && !gap(e, p + start_offset, n - start_offset)) return false;
    return true;
}

static bool normalized_piece(enc *e, const uint8_t *p, size_t n) { return pretok(e, 0, p, n); }

static bool raw_piece(enc *e, const uint8_t *p, size_t n) {
    const kiln_tokenizer *t = e->t;
    if (t->n_norm == 0) return split_added(e, &t->match_norm, p, n, normalized_piece);
    if (kiln_tok_normalize(t, p, n, &e->norm, &e->tmp) != KILN_OK) return fail_nomem(e, "normalizer");
    /* e->norm is not touched again until this piece is done (normalized_piece never normalizes) */
    return split_added(e, &t->match_norm, e->norm.data, e->norm.len, normalized_piece);
}

kiln_status kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len, unsigned flags,
                                  int32_t **ids, size_t *n, kiln_error *err) {
    *ids = NULL;
    *n = 0;
    if (!t || (!text && len)) return kiln_err(err, KILN_ERR_INVALID_ARG, "tokenizer_encode: NULL tokenizer or text");
    if (flags & ~(KILN_TOK_ADD_SPECIAL | KILN_TOK_NO_SPECIAL))
        return kiln_err(err, KILN_ERR_INVALID_ARG, "tokenizer_encode: unknown flags 0x%x", flags);
    const uint8_t *p = (const uint8_t *)text;
    size_t ok = kiln_utf8_valid_prefix(p, len);
    if (ok != len)
        return kiln_err(err, KILN_ERR_TOKENIZER, "tokenizer: input is not valid UTF-8 at byte offset %zu (byte 0x%02X)", ok, p[ok]);
    enc e = {.t = t, .flags = flags, .err = err, .st = KILN_OK};
    e.rank = malloc(BPE_SMALL * sizeof *e.rank);
    e.rank_new = malloc(BPE_SMALL * sizeof *e.rank_new);
    bool good = e.rank && e.rank_new;
    if (!good) fail_nomem(&e, "scratch");
    if (good && (flags & KILN_TOK_ADD_SPECIAL))
        for (uint32_t i = 0; good && i < t->n_prefix; i++) good = push_id(&e, t->prefix[i]);
    if (good) good = split_added(&e, &t->match_raw, p, len, raw_piece);
    if (good && (flags & KILN_TOK_ADD_SPECIAL))
        for (uint32_t i = 0; good && i < t->n_suffix; i++) good = push_id(&e, t->suffix[i]);
    kiln_buf_free(&e.norm);
    kiln_buf_free(&e.tmp);
    free(e.syms);
    free(e.rank);
    free(e.rank_new);
    free(e.heap);
    if (e.md) pcre2_match_data_free(e.md);
    if (e.mctx) pcre2_match_context_free(e.mctx);
    if (e.jit_stack) pcre2_jit_stack_free(e.jit_stack);
    if (!good) {
        free(e.ids);
        return e.st != KILN_OK ? e.st : kiln_err(err, KILN_ERR_INTERNAL, "tokenizer: encode failed");
    }
    *ids = e.ids;
    *n = e.n;
    return KILN_OK;
}

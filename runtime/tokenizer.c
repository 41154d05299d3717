/*
 * tokenizer.c — loading a tokenizer blob (format in kiln_tokenizer.h):
 * validate every chunk as hostile input, then build what encode and decode
 * need — the vocabulary hash (keyed by raw bytes for byte-level models, so
 * the encoder never maps bytes to GPT-2 characters), the merge table, the
 * added-token matchers and each id's decode piece. Everything derived lives
 * in one owned byte store, addressed by offsets (tok_span).
 *
 * Load cost is linear in the blob: ~150k vocab + ~280k merges take a few
 * milliseconds (bench/bench_tokenizer measures it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "tokenizer_internal.h"

/* ---- hashing ---- */

uint32_t kiln_tok_hash(const uint8_t *p, size_t n) {
    uint64_t h = XXH3_64bits(p, n);
    return (uint32_t)(h ^ (h >> 32));
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n && c < (1u << 30)) c <<= 1;
    return c;
}

static bool strmap_init(tok_strmap *m, uint32_t n_keys) {
    uint32_t cap = pow2_at_least((uint64_t)n_keys * 2);
    m->slot_id = calloc(cap, sizeof *m->slot_id);
    m->slot_hash = malloc((size_t)cap * sizeof *m->slot_hash);
    m->mask = cap - 1;
    return m->slot_id && m->slot_hash;
}

static void strmap_free(tok_strmap *m) {
    free(m->slot_id);
    free(m->slot_hash);
    memset(m, 0, sizeof *m);
}

int32_t kiln_tok_strmap_get(const tok_strmap *m, const kiln_tokenizer *t, const tok_span *keys,
                            const uint8_t *p, size_t n) {
    if (!m->slot_id) return -1;
    uint32_t h = kiln_tok_hash(p, n);
    for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
        uint32_t v = m->slot_id[i];
        if (v == 0) return -1;
        if (m->slot_hash[i] == h) {
            tok_span k = keys[v - 1];
            if (k.len == n && memcmp(t->store + k.off, p, n) == 0) return (int32_t)(v - 1);
        }
    }
}

/* Insert value v (keyed by keys[v]); returns the value already there for an equal key, or -1. */
static int32_t strmap_put(tok_strmap *m, const kiln_tokenizer *t, const tok_span *keys, uint32_t v) {
    tok_span k = keys[v];
    const uint8_t *p = t->store + k.off;
    uint32_t h = kiln_tok_hash(p, k.len);
    for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
        uint32_t s = m->slot_id[i];
        if (s == 0) {
            m->slot_id[i] = v + 1;
            m->slot_hash[i] = h;
            return -1;
        }
        if (m->slot_hash[i] == h) {
            tok_span o = keys[s - 1];
            if (o.len == k.len && memcmp(t->store + o.off, p, k.len) == 0) return (int32_t)(s - 1);
        }
    }
}

/* ---- blob reading ---- */

typedef struct chunk {
    uint32_t tag;
    uint32_t off;  /* payload offset in the store (the store may move while loading) */
    uint32_t size;
} chunk;

/* A cursor over one chunk's payload; every read is bounds-checked. */
typedef struct rd {
    const uint8_t *p;
    size_t n, at;
    const char *what; /* chunk name for messages */
    kiln_error *err;
    bool bad;
} rd;

static bool rd_need(rd *r, size_t k) {
    if (r->bad) return false;
    if (k > r->n - r->at) {
        kiln_err(r->err, KILN_ERR_FORMAT, "tokenizer blob: chunk %s is truncated (needs %zu more bytes at offset %zu of %zu)",
                 r->what, k, r->at, r->n);
        r->bad = true;
        return false;
    }
    return true;
}

static uint32_t rd_u32(rd *r) {
    if (!rd_need(r, 4)) return 0;
    uint32_t v = kiln_rd_u32(r->p + r->at);
    r->at += 4;
    return v;
}

static const uint8_t *rd_bytes(rd *r, size_t k) {
    if (!rd_need(r, k)) return NULL;
    const uint8_t *q = r->p + r->at;
    r->at += k;
    return q;
}

static void tag_name(uint32_t tag, char out[5]) {
    for (int i = 0; i < 4; i++) {
        uint8_t c = (uint8_t)(tag >> (8 * i));
        out[i] = (c >= 0x20 && c < 0x7F) ? (char)c : '?';
    }
    out[4] = 0;
}

static bool valid_utf8(const uint8_t *p, size_t n) { return kiln_utf8_valid_prefix(p, n) == n; }

/* ---- building ---- */

typedef struct loader {
    kiln_tokenizer *t;
    kiln_buf store;  /* grows while loading; becomes t->store */
    kiln_error *err;
    chunk ch[KILN_TOK_MAX_CHUNKS];
    uint32_t n_ch;
} loader;

static const chunk *find_chunk(const loader *L, uint32_t tag) {
    for (uint32_t i = 0; i < L->n_ch; i++)
        if (L->ch[i].tag == tag) return &L->ch[i];
    return NULL;
}

/* A reader over a chunk's payload, valid until the store next grows. */
static rd chunk_rd(const loader *L, const chunk *c, const char *name) {
    rd r = {L->store.data + c->off, c->size, 0, name, L->err, false};
    return r;
}

/* Span of blob bytes q (q points into the blob copy at the start of store). */
static tok_span blob_span(const loader *L, const uint8_t *q, uint32_t len) {
    tok_span s = {(uint32_t)(q - L->store.data), len};
    return s;
}

static bool store_add(loader *L, const void *p, size_t n, tok_span *out) {
    if (L->store.len + n > UINT32_MAX) return false;
    out->off = (uint32_t)L->store.len;
    out->len = (uint32_t)n;
    bool ok = kiln_buf_append(&L->store, p, n);
    L->t->store = L->store.data;
    return ok;
}

static kiln_status nomem(loader *L, const char *what) {
    return kiln_err(L->err, KILN_ERR_NOMEM, "tokenizer: out of memory while building %s", what);
}

static kiln_status read_steps(loader *L, uint32_t tag, const char *name, tok_step *steps, uint32_t *n_steps) {
    const chunk *c = find_chunk(L, tag);
    *n_steps = 0;
    if (!c) return KILN_OK;
    rd r = chunk_rd(L, c, name);
    uint32_t n = rd_u32(&r);
    if (r.bad) return KILN_ERR_FORMAT;
    if (n > KILN_TOK_MAX_STEPS)
        return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: %s has %u steps (at most %d)", name, n, KILN_TOK_MAX_STEPS);
    for (uint32_t i = 0; i < n; i++) {
        tok_step *s = &steps[i];
        s->kind = rd_u32(&r);
        s->arg0 = rd_u32(&r);
        s->arg1 = rd_u32(&r);
        uint32_t la = rd_u32(&r), lb = rd_u32(&r);
        if (r.bad) return KILN_ERR_FORMAT;
        if (la > KILN_TOK_MAX_TOKEN_BYTES * 16 || lb > KILN_TOK_MAX_TOKEN_BYTES * 16)
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: %s step %u has a string of %u bytes", name, i, la > lb ? la : lb);
        const uint8_t *a = rd_bytes(&r, la), *b = rd_bytes(&r, lb);
        if (r.bad) return KILN_ERR_FORMAT;
        if (!valid_utf8(a, la) || !valid_utf8(b, lb))
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: %s step %u has a string that is not UTF-8", name, i);
        s->a = blob_span(L, a, la);
        s->b = blob_span(L, b, lb);
        size_t pad = (4 - (la + lb) % 4) % 4;
        if (!rd_bytes(&r, pad)) return KILN_ERR_FORMAT;
    }
    *n_steps = n;
    return KILN_OK;
}

static kiln_status read_model(loader *L) {
    kiln_tokenizer *t = L->t;
    const chunk *c = find_chunk(L, KILN_TOK_CHUNK_MODL);
    if (!c) return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: the MODL chunk is missing");
    rd r = chunk_rd(L, c, "MODL");
    uint32_t type = rd_u32(&r);
    t->model_flags = rd_u32(&r);
    t->unk_id = (int32_t)rd_u32(&r);
    (void)rd_u32(&r); /* HF vocab size: informational */
    if (r.bad) return KILN_ERR_FORMAT;
    if (type != KILN_TOK_MODEL_BPE)
        return kiln_err(L->err, KILN_ERR_UNSUPPORTED, "tokenizer blob: model type %u is not supported (1 = BPE)", type);
    if (t->model_flags & ~(uint32_t)KILN_TOK_MF_ALL_)
        return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: MODL has unknown flags 0x%x", t->model_flags);
    return KILN_OK;
}

static kiln_status read_vocab(loader *L) {
    kiln_tokenizer *t = L->t;
    const chunk *c = find_chunk(L, KILN_TOK_CHUNK_VOCB);
    if (!c) return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: the VOCB chunk is missing");
    rd r = chunk_rd(L, c, "VOCB");
    uint32_t n = rd_u32(&r), nbytes = rd_u32(&r);
    if (r.bad) return KILN_ERR_FORMAT;
    if (n == 0 || n > KILN_TOK_MAX_IDS)
        return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: VOCB has %u ids (1..%u)", n, KILN_TOK_MAX_IDS);
    const uint8_t *ends = rd_bytes(&r, (size_t)n * 4);
    const uint8_t *present = rd_bytes(&r, n);
    const uint8_t *bytes = rd_bytes(&r, nbytes);
    if (r.bad) return KILN_ERR_FORMAT;
    if (r.at != r.n) return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: VOCB has %zu stray bytes", r.n - r.at);
    t->n_ids = n;
    t->tok_str = calloc(n, sizeof *t->tok_str);
    t->id_kind = calloc(n, 1);
    t->vocab_key = calloc(n, sizeof *t->vocab_key);
    if (!t->tok_str || !t->id_kind || !t->vocab_key) return nomem(L, "the vocabulary");
    uint32_t prev = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t e = kiln_rd_u32(ends + 4 * (size_t)i);
        if (e < prev || e > nbytes || e - prev > KILN_TOK_MAX_TOKEN_BYTES)
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: VOCB end offset of id %u is %u (previous %u, bytes %u)",
                            i, e, prev, nbytes);
        if (present[i] > 1) return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: VOCB presence byte of id %u is %u", i, present[i]);
        if (!valid_utf8(bytes + prev, e - prev))
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: VOCB token %u is not valid UTF-8", i);
        t->tok_str[i] = blob_span(L, bytes + prev, e - prev);
        t->id_kind[i] = present[i];
        prev = e;
    }
    if (prev != nbytes) return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: VOCB offsets end at %u of %u bytes", prev, nbytes);
    return KILN_OK;
}

/* The vocabulary hash. Byte-level models key each token by the raw bytes its
 * characters stand for (tokens with other characters cannot be reached by
 * the encoder and get no key); other models key by the string itself. */
static kiln_status build_vocab_map(loader *L) {
    kiln_tokenizer *t = L->t;
    bool bl = t->model_flags & KILN_TOK_MF_BYTE_LEVEL;
    uint32_t n_keys = 0;
    for (uint32_t i = 0; i < t->n_ids; i++) {
        if (!(t->id_kind[i] & 1)) continue;
        tok_span s = t->tok_str[i];
        if (!bl) {
            t->vocab_key[i] = s;
            n_keys++;
            continue;
        }
        uint8_t raw[KILN_TOK_MAX_TOKEN_BYTES];
        size_t m = 0, k = 0;
        const uint8_t *p = L->store.data + s.off;
        bool ok = true;
        while (k < s.len) {
            size_t cl;
            int b = kiln_bytelevel_byte(kiln_utf8_decode(p + k, s.len - k, &cl));
            k += cl;
            if (b < 0) {
                ok = false;
                break;
            }
            raw[m++] = (uint8_t)b;
        }
        t->vocab_key[i].len = UINT32_MAX; /* no key */
        if (!ok) continue;
        if (!store_add(L, raw, m, &t->vocab_key[i])) return nomem(L, "the vocabulary");
        n_keys++;
    }
    if (!strmap_init(&t->vocab, n_keys)) return nomem(L, "the vocabulary hash");
    for (uint32_t i = 0; i < t->n_ids; i++) {
        if (!(t->id_kind[i] & 1) || t->vocab_key[i].len == UINT32_MAX) continue;
        int32_t other = strmap_put(&t->vocab, L->t, t->vocab_key, i);
        if (other >= 0)
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: VOCB ids %d and %u have the same token", other, i);
    }
    for (int c = 0; c < 128; c++) {
        uint8_t ch = (uint8_t)c;
        t->ascii_id[c] = bl ? -1 : kiln_tok_strmap_get(&t->vocab, t, t->vocab_key, &ch, 1);
    }
    for (int b = 0; b < 256; b++) {
        t->byte_sym[b] = -1;
        if (bl) {
            uint8_t c = (uint8_t)b;
            t->byte_sym[b] = kiln_tok_strmap_get(&t->vocab, t, t->vocab_key, &c, 1);
        } else if (t->model_flags & KILN_TOK_MF_BYTE_FALLBACK) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_sym[b] = kiln_tok_strmap_get(&t->vocab, t, t->vocab_key, (const uint8_t *)name, 6);
        }
    }
    if (t->unk_id != -1 && (t->unk_id < 0 || (uint32_t)t->unk_id >= t->n_ids || !(t->id_kind[t->unk_id] & 1)))
        return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: MODL unk id %d is not in the vocabulary", t->unk_id);
    return KILN_OK;
}

/* The word-splitting shortcut (see split_char in tokenizer_internal.h): the
 * character a Replace normalizer writes (llama2: " " → "▁"), when no
 * vocabulary token has it after a different character. Not with
 * ignore_merges (a whole word would be looked up whole) nor byte-level. */
static void find_split_char(loader *L) {
    kiln_tokenizer *t = L->t;
    t->split_char.len = 0;
    if (t->model_flags & (KILN_TOK_MF_BYTE_LEVEL | KILN_TOK_MF_IGNORE_MERGES)) return;
    tok_span c = {0, 0};
    for (uint32_t i = 0; i < t->n_norm; i++)
        if (t->norm[i].kind == KILN_TOK_NORM_REPLACE) c = t->norm[i].b;
    size_t cl;
    if (c.len == 0 || (kiln_utf8_decode(L->store.data + c.off, c.len, &cl), cl != c.len)) return;
    const uint8_t *cp = L->store.data + c.off;
    for (uint32_t id = 0; id < t->n_ids; id++) {
        if (!(t->id_kind[id] & 1)) continue;
        tok_span s = t->vocab_key[id];
        const uint8_t *p = L->store.data + s.off;
        for (size_t k = 1; k + c.len <= s.len; k++) {
            if (memcmp(p + k, cp, c.len) != 0) continue;
            if (k < c.len || memcmp(p + k - c.len, cp, c.len) != 0) return; /* "<other><c>" inside a token */
        }
    }
    t->split_char = c;
}

static kiln_status read_merges(loader *L) {
    kiln_tokenizer *t = L->t;
    const chunk *c = find_chunk(L, KILN_TOK_CHUNK_MERG);
    uint32_t n = 0;
    rd r = {NULL, 0, 0, "MERG", L->err, false};
    if (c) {
        r = chunk_rd(L, c, "MERG");
        n = rd_u32(&r);
        if (r.bad) return KILN_ERR_FORMAT;
        if (n > KILN_TOK_MAX_MERGES || (uint64_t)n * 12 != r.n - 4)
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: MERG says %u merges in %zu bytes", n, r.n);
    }
    uint64_t cap = pow2_at_least((uint64_t)n * 2);
    t->merges.slots = malloc(cap * sizeof *t->merges.slots);
    if (!t->merges.slots) return nomem(L, "the merge table");
    for (uint64_t i = 0; i < cap; i++) t->merges.slots[i].key = UINT64_MAX;
    t->merges.mask = cap - 1;
    t->merges.shift = 64;
    for (uint64_t k = cap; k > 1; k >>= 1) t->merges.shift--;
    t->n_merges = n;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *q = r.p + 4 + (size_t)i * 12;
        uint32_t a = kiln_rd_u32(q), b = kiln_rd_u32(q + 4), m = kiln_rd_u32(q + 8);
        if (a >= t->n_ids || b >= t->n_ids || m >= t->n_ids || !(t->id_kind[a] & 1) || !(t->id_kind[b] & 1) ||
            !(t->id_kind[m] & 1))
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: merge %u (%u, %u → %u) names an id outside the vocabulary",
                            i, a, b, m);
        uint64_t key = (uint64_t)a << 32 | b;
        uint64_t s = kiln_tok_merge_slot(&t->merges, key);
        tok_merge_slot *sl = t->merges.slots;
        while (sl[s].key != UINT64_MAX && sl[s].key != key) s = (s + 1) & t->merges.mask;
        sl[s].key = key; /* a repeated pair takes the later rank, as HF's HashMap collect does */
        sl[s].rank = i;
        sl[s].merged = (int32_t)m;
    }
    return KILN_OK;
}

typedef struct sort_item {
    uint32_t key;  /* first byte << 24 | (0xFFFFFF - length) */
    uint32_t idx;
} sort_item;

static int cmp_sort_item(const void *a, const void *b) {
    const sort_item *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

static kiln_status build_matcher(loader *L, tok_matcher *m, bool normalized) {
    kiln_tokenizer *t = L->t;
    uint32_t n = 0;
    for (uint32_t i = 0; i < t->n_added; i++)
        if (!!(t->added[i].flags & KILN_TOK_AF_NORMALIZED) == normalized && t->added[i].content.len > 0) n++;
    m->n = n;
    m->order = malloc(((size_t)n + 1) * sizeof *m->order);
    sort_item *items = malloc(((size_t)n + 1) * sizeof *items);
    if (!m->order || !items) {
        free(items);
        return nomem(L, "the added-token matcher");
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        if (!!(a->flags & KILN_TOK_AF_NORMALIZED) != normalized || a->content.len == 0) continue;
        uint8_t first = L->store.data[a->content.off];
        items[k].key = (uint32_t)first << 24 | (0xFFFFFFu - a->content.len);
        items[k].idx = i;
        k++;
    }
    qsort(items, n, sizeof *items, cmp_sort_item);
    memset(m->first, 0, sizeof m->first);
    for (uint32_t i = 0; i < n; i++) {
        m->order[i] = items[i].idx;
        m->first[(items[i].key >> 24) + 1]++;
    }
    for (int b = 0; b < 256; b++) m->first[b + 1] += m->first[b];
    free(items);
    return KILN_OK;
}

static kiln_status read_added(loader *L) {
    kiln_tokenizer *t = L->t;
    const chunk *c = find_chunk(L, KILN_TOK_CHUNK_ADDT);
    if (!c) return KILN_OK;
    rd r = chunk_rd(L, c, "ADDT");
    uint32_t n = rd_u32(&r);
    if (r.bad) return KILN_ERR_FORMAT;
    if (n > KILN_TOK_MAX_ADDED || (uint64_t)n * 12 > r.n - 4)
        return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: ADDT says %u added tokens in %zu bytes", n, r.n);
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    if (!t->added) return nomem(L, "the added tokens");
    const uint8_t *hdr = rd_bytes(&r, (size_t)n * 12);
    if (r.bad) return KILN_ERR_FORMAT;
    int64_t prev_id = -1;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = kiln_rd_u32(hdr + 12 * (size_t)i), flags = kiln_rd_u32(hdr + 12 * (size_t)i + 4);
        uint32_t len = kiln_rd_u32(hdr + 12 * (size_t)i + 8);
        if (id >= t->n_ids || (int64_t)id <= prev_id)
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: added token %u has id %u (ids must ascend below %u)", i, id, t->n_ids);
        if (flags & ~(uint32_t)KILN_TOK_AF_ALL_)
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: added token %u has unknown flags 0x%x", id, flags);
        if (len == 0 || len > KILN_TOK_MAX_TOKEN_BYTES)
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: added token %u has a content of %u bytes", id, len);
        const uint8_t *q = rd_bytes(&r, len);
        if (r.bad) return KILN_ERR_FORMAT;
        if (!valid_utf8(q, len)) return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: added token %u is not UTF-8", id);
        t->added[i].id = (int32_t)id;
        t->added[i].flags = flags;
        t->added[i].content = blob_span(L, q, len);
        t->tok_str[id] = t->added[i].content; /* HF's id_to_token looks at added tokens first */
        t->id_kind[id] |= 2;
        prev_id = id;
    }
    t->n_added = n;
    return KILN_OK;
}

/* After the normalizer is known: match patterns of normalized added tokens
 * are their normalized content (HF also decodes them through that form). */
static kiln_status finish_added(loader *L) {
    kiln_tokenizer *t = L->t;
    kiln_buf a = {0}, b = {0};
    kiln_status st = KILN_OK;
    tok_span *contents = t->added_key = malloc(((size_t)t->n_added + 1) * sizeof *contents);
    if (!contents) return nomem(L, "the added tokens");
    for (uint32_t i = 0; i < t->n_added; i++) {
        tok_added *x = &t->added[i];
        contents[i] = x->content;
        if (!(x->flags & KILN_TOK_AF_NORMALIZED) || t->n_norm == 0) continue;
        a.len = 0;
        if (kiln_tok_normalize(t, L->store.data + x->content.off, x->content.len, &a, &b) != KILN_OK) {
            st = nomem(L, "the added tokens");
            goto out;
        }
        if (a.len > KILN_TOK_MAX_TOKEN_BYTES * 4) {
            st = kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: added token %d normalizes to %zu bytes", x->id, a.len);
            goto out;
        }
        if (!store_add(L, a.data, a.len, &x->content)) {
            st = nomem(L, "the added tokens");
            goto out;
        }
    }
    /* content → index, for kiln_tokenizer_token_id */
    if (!strmap_init(&t->added_map, t->n_added)) {
        st = nomem(L, "the added-token map");
        goto out;
    }
    for (uint32_t i = 0; i < t->n_added; i++) strmap_put(&t->added_map, t, contents, i);
    if ((st = build_matcher(L, &t->match_raw, false)) != KILN_OK) goto out;
    if ((st = build_matcher(L, &t->match_norm, true)) != KILN_OK) goto out;
out:
    kiln_buf_free(&a);
    kiln_buf_free(&b);
    return st;
}

static kiln_status check_pipeline(loader *L) {
    kiln_tokenizer *t = L->t;
    for (uint32_t i = 0; i < t->n_norm; i++) {
        tok_step *s = &t->norm[i];
        if (s->kind < KILN_TOK_NORM_PREPEND || s->kind > KILN_TOK_NORM_NFC)
            return kiln_err(L->err, KILN_ERR_UNSUPPORTED, "tokenizer blob: normalizer step %u has unknown kind %u", i, s->kind);
        if (s->kind == KILN_TOK_NORM_REPLACE && s->a.len == 0)
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: normalizer Replace step %u has an empty pattern", i);
    }
    bool byte_level = false;
    for (uint32_t i = 0; i < t->n_pre; i++) {
        tok_step *s = &t->pre[i];
        if (s->kind == KILN_TOK_PRE_BYTELEVEL) {
            if (i + 1 != t->n_pre)
                return kiln_err(L->err, KILN_ERR_UNSUPPORTED, "tokenizer blob: ByteLevel must be the last pre-tokenizer step");
            byte_level = true;
        } else if (s->kind != KILN_TOK_PRE_SPLIT) {
            return kiln_err(L->err, KILN_ERR_UNSUPPORTED, "tokenizer blob: pre-tokenizer step %u has unknown kind %u", i, s->kind);
        }
        const char *pat = NULL;
        size_t plen = 0;
        if (s->kind == KILN_TOK_PRE_SPLIT) {
            pat = (const char *)L->store.data + s->a.off;
            plen = s->a.len;
        } else if (s->arg0) {
            pat = KILN_TOK_GPT2_REGEX;
            plen = strlen(pat);
        }
        if (!pat) continue;
        t->pre_rx[i] = (uint8_t)kiln_tok_rx_known((const uint8_t *)pat, plen);
        if (t->pre_rx[i] != KILN_TOK_RX_PCRE2) continue; /* the built-in matcher runs it */
        kiln_status st = kiln_tok_rx_compile((const uint8_t *)pat, plen, &t->pre_re[i], L->err);
        if (st != KILN_OK) return kiln_err_prefix(L->err, "tokenizer blob: pre-tokenizer step %u: ", i);
    }
    if (byte_level != !!(t->model_flags & KILN_TOK_MF_BYTE_LEVEL))
        return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: MODL byte-level flag disagrees with the pre-tokenizer");
    if (byte_level && (t->model_flags & KILN_TOK_MF_BYTE_FALLBACK))
        return kiln_err(L->err, KILN_ERR_UNSUPPORTED, "tokenizer blob: byte_fallback with a ByteLevel pre-tokenizer is not supported");

    /* decoder: ByteLevel alone, or Replace* ByteFallback? Fuse? Strip? in that order */
    if (t->n_dec == 0) return kiln_err(L->err, KILN_ERR_UNSUPPORTED, "tokenizer blob: no decoder");
    if (t->dec[0].kind == KILN_TOK_DEC_BYTELEVEL) {
        if (t->n_dec != 1) return kiln_err(L->err, KILN_ERR_UNSUPPORTED, "tokenizer blob: ByteLevel must be the only decoder step");
        t->dec_byte_level = true;
        return KILN_OK;
    }
    int stage = 0; /* 0 replace, 1 bytefallback, 2 fuse, 3 strip */
    bool fused = false;
    for (uint32_t i = 0; i < t->n_dec; i++) {
        tok_step *s = &t->dec[i];
        int st;
        switch (s->kind) {
        case KILN_TOK_DEC_REPLACE: st = 0; break;
        case KILN_TOK_DEC_BYTEFALLBACK: st = 1; t->dec_byte_fallback = true; break;
        case KILN_TOK_DEC_FUSE: st = 2; fused = true; break;
        case KILN_TOK_DEC_STRIP: st = 3; break;
        default:
            return kiln_err(L->err, KILN_ERR_UNSUPPORTED, "tokenizer blob: decoder step %u has kind %u where only Replace, "
                            "ByteFallback, Fuse, Strip may follow in that order", i, s->kind);
        }
        if (st < stage || (st == stage && st != 0))
            return kiln_err(L->err, KILN_ERR_UNSUPPORTED, "tokenizer blob: decoder steps must be Replace*, ByteFallback, Fuse, Strip in that order");
        stage = st;
        if (s->kind == KILN_TOK_DEC_REPLACE && s->a.len == 0)
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: decoder Replace step %u has an empty pattern", i);
        if (s->kind == KILN_TOK_DEC_STRIP) {
            size_t cl;
            if (!fused || s->arg1 != 0 || s->a.len == 0 ||
                (kiln_utf8_decode(L->store.data + s->a.off, s->a.len, &cl), cl != s->a.len))
                return kiln_err(L->err, KILN_ERR_UNSUPPORTED, "tokenizer blob: decoder Strip is supported only after Fuse, with one "
                                "character and stop = 0");
            t->dec_strip = true;
            t->strip_char = kiln_utf8_decode(L->store.data + s->a.off, s->a.len, &cl);
            t->strip_start = s->arg0;
        }
    }
    return KILN_OK;
}

bool kiln_tok_decode_piece_is_byte(const uint8_t *p, size_t n, uint8_t *byte) {
    /* HF ByteFallback: len 6, "<0x" .. ">", u8::from_str_radix(middle two, 16) (which takes a leading '+') */
    if (n != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>') return false;
    int v = 0, digits = 0;
    for (int i = 3; i < 5; i++) {
        uint8_t c = p[i];
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else if (c == '+' && i == 3) continue;
        else return false;
        v = v * 16 + d;
        digits++;
    }
    if (digits == 0) return false;
    *byte = (uint8_t)v;
    return true;
}

/* Per id: the piece the decoder chain starts from (see tokenizer_decode.c). */
static kiln_status build_decode(loader *L) {
    kiln_tokenizer *t = L->t;
    t->dec_piece = calloc(t->n_ids, sizeof *t->dec_piece);
    t->dec_byte = malloc((size_t)t->n_ids * sizeof *t->dec_byte);
    if (!t->dec_piece || !t->dec_byte) return nomem(L, "the decoder table");
    /* contents of special added tokens: HF skips any token whose string is one */
    tok_strmap special = {0};
    tok_span *sp = malloc(((size_t)t->n_added + 1) * sizeof *sp);
    uint32_t n_sp = 0;
    if (!sp) return nomem(L, "the decoder table");
    for (uint32_t i = 0; i < t->n_added; i++)
        if (t->added[i].flags & KILN_TOK_AF_SPECIAL) sp[n_sp++] = t->tok_str[t->added[i].id];
    kiln_status st = KILN_OK;
    if (!strmap_init(&special, n_sp)) {
        st = nomem(L, "the decoder table");
        goto out;
    }
    for (uint32_t i = 0; i < n_sp; i++) strmap_put(&special, t, sp, i);

    uint32_t ai = 0;
    kiln_buf tmp = {0}, tmp2 = {0};
    for (uint32_t id = 0; id < t->n_ids; id++) {
        t->dec_byte[id] = -1;
        if (!t->id_kind[id]) continue;
        /* the token string HF hands to the decoder: an added token's (normalized) content, else the vocab string */
        tok_span s = t->tok_str[id];
        while (ai < t->n_added && (uint32_t)t->added[ai].id < id) ai++;
        if (ai < t->n_added && (uint32_t)t->added[ai].id == id) s = t->added[ai].content;
        const uint8_t *p = L->store.data + s.off;
        if (kiln_tok_strmap_get(&special, t, sp, p, s.len) >= 0) t->id_kind[id] |= 4;
        tmp.len = 0;
        bool is_added = ai < t->n_added && (uint32_t)t->added[ai].id == id;
        if (t->dec_byte_level && !is_added && (t->model_flags & KILN_TOK_MF_BYTE_LEVEL) &&
            t->vocab_key[id].len != UINT32_MAX) {
            t->dec_piece[id] = t->vocab_key[id]; /* the raw bytes the vocabulary is keyed by: the same mapping */
            continue;
        }
        if (t->dec_byte_level) {
            /* each character back to its byte; a token with any other character passes as UTF-8 */
            size_t k = 0;
            bool ok = true;
            while (k < s.len) {
                size_t cl;
                int b = kiln_bytelevel_byte(kiln_utf8_decode(p + k, s.len - k, &cl));
                if (b < 0) {
                    ok = false;
                    break;
                }
                uint8_t bb = (uint8_t)b;
                kiln_buf_append(&tmp, &bb, 1);
                k += cl;
            }
            if (!ok) {
                tmp.len = 0;
                kiln_buf_append(&tmp, p, s.len);
            }
        } else {
            kiln_buf_append(&tmp, p, s.len);
            for (uint32_t k = 0; k < t->n_dec; k++) {
                tok_step *d = &t->dec[k];
                if (d->kind != KILN_TOK_DEC_REPLACE) continue;
                const uint8_t *pa = L->store.data + d->a.off, *pb = L->store.data + d->b.off;
                tmp2.len = 0;
                size_t i = 0;
                while (i < tmp.len) {
                    if (i + d->a.len <= tmp.len && memcmp(tmp.data + i, pa, d->a.len) == 0) {
                        kiln_buf_append(&tmp2, pb, d->b.len);
                        i += d->a.len;
                    } else {
                        kiln_buf_append(&tmp2, tmp.data + i, 1);
                        i++;
                    }
                }
                kiln_buf tsw = tmp;
                tmp = tmp2;
                tmp2 = tsw;
            }
            uint8_t byte;
            if (t->dec_byte_fallback && kiln_tok_decode_piece_is_byte(tmp.data, tmp.len, &byte)) t->dec_byte[id] = byte;
        }
        if (tmp.failed || tmp2.failed || (tmp.len && !store_add(L, tmp.data, tmp.len, &t->dec_piece[id]))) {
            st = nomem(L, "the decoder table");
            break;
        }
        t->store = L->store.data;
    }
    kiln_buf_free(&tmp);
    kiln_buf_free(&tmp2);
out:
    strmap_free(&special);
    free(sp);
    return st;
}

static kiln_status read_specials(loader *L) {
    kiln_tokenizer *t = L->t;
    t->bos = -1;
    const chunk *c = find_chunk(L, KILN_TOK_CHUNK_POST);
    if (c) {
        rd r = chunk_rd(L, c, "POST");
        uint32_t np = rd_u32(&r), ns = rd_u32(&r);
        if (r.bad) return KILN_ERR_FORMAT;
        if (np > 64 || ns > 64 || (uint64_t)(np + ns) * 4 != r.n - 8)
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: POST says %u + %u ids in %zu bytes", np, ns, r.n);
        t->prefix = malloc(((size_t)np + 1) * sizeof(int32_t));
        t->suffix = malloc(((size_t)ns + 1) * sizeof(int32_t));
        if (!t->prefix || !t->suffix) return nomem(L, "the special tokens");
        for (uint32_t i = 0; i < np + ns; i++) {
            uint32_t id = rd_u32(&r);
            if (id >= t->n_ids || !t->id_kind[id])
                return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: POST id %u is not in the vocabulary", id);
            if (i < np) t->prefix[i] = (int32_t)id;
            else t->suffix[i - np] = (int32_t)id;
        }
        t->n_prefix = np;
        t->n_suffix = ns;
    }
    c = find_chunk(L, KILN_TOK_CHUNK_SPEC);
    if (c) {
        rd r = chunk_rd(L, c, "SPEC");
        int32_t bos = (int32_t)rd_u32(&r);
        uint32_t ne = rd_u32(&r);
        if (r.bad) return KILN_ERR_FORMAT;
        if (ne > KILN_TOK_MAX_EOS || (uint64_t)ne * 4 != r.n - 8)
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: SPEC says %u eos ids in %zu bytes", ne, r.n);
        if (bos != -1 && (bos < 0 || (uint32_t)bos >= t->n_ids || !t->id_kind[bos]))
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: SPEC bos id %d is not in the vocabulary", bos);
        t->bos = bos;
        for (uint32_t i = 0; i < ne; i++) {
            uint32_t id = rd_u32(&r);
            if (id >= t->n_ids || !t->id_kind[id])
                return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: SPEC eos id %u is not in the vocabulary", id);
            t->eos[i] = (int32_t)id;
        }
        t->n_eos = ne;
    }
    return KILN_OK;
}

static kiln_status read_chunks(loader *L, size_t len) {
    const uint8_t *b = L->store.data;
    if (len < KILN_TOK_HEADER_SIZE)
        return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: %zu bytes is too short for the %d-byte header", len, KILN_TOK_HEADER_SIZE);
    if (memcmp(b, KILN_TOK_MAGIC, 8) != 0)
        return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: bad magic (not a kiln tokenizer)");
    uint32_t major = (uint32_t)b[8] | (uint32_t)b[9] << 8;
    if (major != KILN_TOK_MAJOR)
        return kiln_err(L->err, KILN_ERR_VERSION, "tokenizer blob: format major version %u (this runtime reads %d)", major, KILN_TOK_MAJOR);
    uint32_t n = kiln_rd_u32(b + 12);
    if (n > KILN_TOK_MAX_CHUNKS)
        return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: %u chunks (at most %d)", n, KILN_TOK_MAX_CHUNKS);
    size_t at = KILN_TOK_HEADER_SIZE;
    for (uint32_t i = 0; i < n; i++) {
        if (len - at < 8)
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: chunk %u header is past the end (offset %zu of %zu)", i, at, len);
        uint32_t tag = kiln_rd_u32(b + at), size = kiln_rd_u32(b + at + 4);
        at += 8;
        char nm[5];
        tag_name(tag, nm);
        if (size > len - at)
            return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: chunk %s (%u bytes) runs past the end of the blob", nm, size);
        for (uint32_t j = 0; j < L->n_ch; j++)
            if (L->ch[j].tag == tag) return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: chunk %s appears twice", nm);
        L->ch[L->n_ch].tag = tag;
        L->ch[L->n_ch].off = (uint32_t)at;
        L->ch[L->n_ch].size = size;
        L->n_ch++;
        at += size;
        size_t pad = (4 - size % 4) % 4;
        if (pad > len - at) return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: chunk %s padding runs past the end", nm);
        at += pad;
    }
    if (at != len) return kiln_err(L->err, KILN_ERR_FORMAT, "tokenizer blob: %zu stray bytes after the last chunk", len - at);
    return KILN_OK;
}

kiln_status kiln_tokenizer_load(const uint8_t *blob, size_t len, kiln_tokenizer **out, kiln_error *err) {
    *out = NULL;
    if (!blob && len) return kiln_err(err, KILN_ERR_INVALID_ARG, "tokenizer blob: NULL data");
    if (len > UINT32_MAX / 2) return kiln_err(err, KILN_ERR_FORMAT, "tokenizer blob: %zu bytes is too large", len);
    kiln_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return kiln_err(err, KILN_ERR_NOMEM, "tokenizer: out of memory");
    loader L = {.t = t, .err = err};
    kiln_status st;
    if (!kiln_buf_append(&L.store, blob, len) || !kiln_buf_reserve(&L.store, len / 2 + 64)) {
        st = nomem(&L, "the tokenizer");
        goto fail;
    }
    t->store = L.store.data;
    if ((st = read_chunks(&L, len)) != KILN_OK) goto fail;
    if ((st = read_model(&L)) != KILN_OK) goto fail;
    if ((st = read_vocab(&L)) != KILN_OK) goto fail;
    if ((st = read_steps(&L, KILN_TOK_CHUNK_NORM, "NORM", t->norm, &t->n_norm)) != KILN_OK) goto fail;
    if ((st = read_steps(&L, KILN_TOK_CHUNK_PRET, "PRET", t->pre, &t->n_pre)) != KILN_OK) goto fail;
    if ((st = read_steps(&L, KILN_TOK_CHUNK_DECO, "DECO", t->dec, &t->n_dec)) != KILN_OK) goto fail;
    if ((st = check_pipeline(&L)) != KILN_OK) goto fail;
    if ((st = build_vocab_map(&L)) != KILN_OK) goto fail; /* before added tokens overwrite tok_str */
    if ((st = read_added(&L)) != KILN_OK) goto fail;
    if ((st = read_merges(&L)) != KILN_OK) goto fail;
    find_split_char(&L);
    if ((st = finish_added(&L)) != KILN_OK) goto fail;
    t->store = L.store.data;
    if ((st = build_decode(&L)) != KILN_OK) goto fail;
    if ((st = read_specials(&L)) != KILN_OK) goto fail;
    t->store = L.store.data;
    t->store_len = L.store.len;
    *out = t;
    return KILN_OK;
fail:
    t->store = L.store.data;
    kiln_tokenizer_free(t);
    return st;
}

void kiln_tokenizer_free(kiln_tokenizer *t) {
    if (!t) return;
    free(t->store);
    free(t->tok_str);
    free(t->id_kind);
    free(t->vocab_key);
    strmap_free(&t->vocab);
    free(t->merges.slots);
    free(t->added);
    free(t->added_key);
    free(t->match_raw.order);
    free(t->match_norm.order);
    strmap_free(&t->added_map);
    for (int i = 0; i < KILN_TOK_MAX_STEPS; i++)
        if (t->pre_re[i]) pcre2_code_free(t->pre_re[i]);
    free(t->dec_piece);
    free(t->dec_byte);
    free(t->prefix);
    free(t->suffix);
    free(t);
}

/* ---- accessors ---- */

uint32_t kiln_tokenizer_vocab_size(const kiln_tokenizer *t) { return t->n_ids; }
int32_t kiln_tokenizer_bos(const kiln_tokenizer *t) { return t->bos; }

int kiln_tokenizer_eos(const kiln_tokenizer *t, const int32_t **ids) {
    if (ids) *ids = t->eos;
    return (int)t->n_eos;
}

const char *kiln_tokenizer_token(const kiln_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || (uint32_t)id >= t->n_ids || !t->id_kind[id]) return NULL;
    if (len) *len = t->tok_str[id].len;
    return (const char *)t->store + t->tok_str[id].off;
}

int32_t kiln_tokenizer_token_id(const kiln_tokenizer *t, const char *s, size_t len) {
    int32_t a = kiln_tok_strmap_get(&t->added_map, t, t->added_key, (const uint8_t *)s, len);
    if (a >= 0) return t->added[a].id;
    if (t->model_flags & KILN_TOK_MF_BYTE_LEVEL) {
        for (uint32_t i = 0; i < t->n_ids; i++) {
            tok_span c = t->tok_str[i];
            if ((t->id_kind[i] & 1) && c.len == len && memcmp(t->store + c.off, s, len) == 0) return (int32_t)i;
        }
        return -1;
    }
    return kiln_tok_strmap_get(&t->vocab, t, t->vocab_key, (const uint8_t *)s, len);
}

bool kiln_tokenizer_is_special(const kiln_tokenizer *t, int32_t id) {
    return id >= 0 && (uint32_t)id < t->n_ids && (t->id_kind[id] & 4);
}

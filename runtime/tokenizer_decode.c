/*
 * tokenizer_decode.c — ids → text, as HF decode(ids, skip_special_tokens):
 * tokens (added tokens first; special ones dropped when asked) go through
 * the decoder chain. Each id's piece is precomputed at load
 * (tokenizer.c:build_decode), so decoding is concatenation plus the two
 * byte rules:
 *
 *   ByteLevel     pieces are raw bytes; the whole result goes through
 *                 from_utf8_lossy (one U+FFFD per maximal invalid subpart);
 *   ByteFallback  consecutive <0xNN> pieces form a run that becomes its
 *                 UTF-8 text when the whole run is valid, else one U+FFFD
 *                 per byte of the run; then Fuse and Strip (leading chars).
 *
 * The stream (kiln_tok_stream) gives the same text incrementally; see
 * kiln_tokenizer.h for its one documented difference on invalid runs.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

static const uint8_t kFFFD[3] = {0xEF, 0xBF, 0xBD};

static kiln_status check_id(const kiln_tokenizer *t, int32_t id, size_t pos, kiln_error *err) {
    if (id < 0 || (uint32_t)id >= t->n_ids || !t->id_kind[id])
        return kiln_err(err, KILN_ERR_TOKENIZER, "tokenizer: id %d at position %zu is not in the vocabulary (%u ids)", id, pos,
                        t->n_ids);
    return KILN_OK;
}

static bool flush_run(kiln_buf *out, kiln_buf *run) {
    bool ok = true;
    if (run->len == 0) return true;
    if (kiln_utf8_valid_prefix(run->data, run->len) == run->len) {
        ok = kiln_buf_append(out, run->data, run->len);
    } else {
        for (size_t i = 0; ok && i < run->len; i++) ok = kiln_buf_append(out, kFFFD, 3);
    }
    run->len = 0;
    return ok;
}

kiln_status kiln_tokenizer_decode(const kiln_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **text,
                                  size_t *len, kiln_error *err) {
    *text = NULL;
    if (len) *len = 0;
    if (!t || (!ids && n)) return kiln_err(err, KILN_ERR_INVALID_ARG, "tokenizer_decode: NULL tokenizer or ids");
    for (size_t i = 0; i < n; i++) {
        kiln_status st = check_id(t, ids[i], i, err);
        if (st != KILN_OK) return st;
    }
    kiln_buf out = {0}, run = {0};
    bool ok = true;
    if (t->dec_byte_level) {
        for (size_t i = 0; ok && i < n; i++) {
            int32_t id = ids[i];
            if (skip_special && (t->id_kind[id] & 4)) continue;
            ok = kiln_buf_append(&run, tok_bytes(t, t->dec_piece[id]), t->dec_piece[id].len);
        }
        ok = ok && kiln_utf8_lossy_append(&out, run.data ? run.data : (const uint8_t *)"", run.len);
    } else {
        for (size_t i = 0; ok && i < n; i++) {
            int32_t id = ids[i];
            if (skip_special && (t->id_kind[id] & 4)) continue;
            if (t->dec_byte[id] >= 0) {
                uint8_t b = (uint8_t)t->dec_byte[id];
                ok = kiln_buf_append(&run, &b, 1);
                continue;
            }
            ok = flush_run(&out, &run) && kiln_buf_append(&out, tok_bytes(t, t->dec_piece[id]), t->dec_piece[id].len);
        }
        ok = ok && flush_run(&out, &run);
        if (ok && t->dec_strip) { /* Strip after Fuse: up to strip_start leading strip_char */
            size_t cut = 0;
            for (uint32_t k = 0; k < t->strip_start && cut < out.len; k++) {
                size_t cl;
                if (kiln_utf8_decode(out.data + cut, out.len - cut, &cl) != t->strip_char) break;
                cut += cl;
            }
            if (cut) {
                memmove(out.data, out.data + cut, out.len - cut);
                out.len -= cut;
            }
        }
    }
    ok = ok && kiln_buf_append(&out, "", 1); /* NUL */
    kiln_buf_free(&run);
    if (!ok) {
        kiln_buf_free(&out);
        return kiln_err(err, KILN_ERR_NOMEM, "tokenizer: out of memory decoding %zu ids", n);
    }
    *text = (char *)out.data;
    if (len) *len = out.len - 1;
    return KILN_OK;
}

/* ---- incremental ---- */

void kiln_tok_stream_init(kiln_tok_stream *s, const kiln_tokenizer *tok, bool skip_special) {
    memset(s, 0, sizeof *s);
    s->tok = tok;
    s->skip_special = skip_special;
    s->strip_left = tok->dec_strip ? tok->strip_start : 0;
}

void kiln_tok_stream_free(kiln_tok_stream *s) {
    kiln_buf_free(&s->out);
    s->n_pending = 0;
}

/* Text that is final: goes through the leading Strip, then out. */
static bool emit(kiln_tok_stream *s, const uint8_t *p, size_t n) {
    while (s->strip_left > 0 && n > 0) {
        size_t cl;
        if (kiln_utf8_decode(p, n, &cl) != s->tok->strip_char) {
            s->strip_left = 0;
            break;
        }
        p += cl;
        n -= cl;
        s->strip_left--;
    }
    if (n > 0) s->strip_left = 0;
    return kiln_buf_append(&s->out, p, n);
}

/* Lossy UTF-8 over a byte stream: hold a valid unfinished prefix, emit
 * characters when complete, U+FFFD per maximal invalid subpart. */
static bool feed_lossy(kiln_tok_stream *s, uint8_t b) {
    s->pending[s->n_pending++] = b;
    while (s->n_pending > 0) {
        uint8_t *q = s->pending;
        int need = kiln_utf8_lead_len(q[0]);
        if (need == 0) { /* cannot start a character */
            if (!emit(s, kFFFD, 3)) return false;
            memmove(q, q + 1, --s->n_pending);
            continue;
        }
        /* how many bytes form a valid prefix? */
        size_t good = kiln_utf8_valid_prefix(q, s->n_pending);
        if (good == s->n_pending) { /* all complete characters */
            bool ok = emit(s, q, good);
            s->n_pending = 0;
            return ok;
        }
        /* q[0..] starts an incomplete or invalid character (good is 0 since we emit eagerly) */
        uint8_t lo = 0x80, hi = 0xBF;
        if (q[0] == 0xE0) lo = 0xA0;
        else if (q[0] == 0xED) hi = 0x9F;
        else if (q[0] == 0xF0) lo = 0x90;
        else if (q[0] == 0xF4) hi = 0x8F;
        size_t k = 1;
        while (k < s->n_pending && (int)k < need) {
            uint8_t c = q[k];
            if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
            k++;
        }
        if (k == s->n_pending && (int)k < need) return true; /* unfinished, keep waiting */
        /* invalid subpart q[0..k) */
        if (!emit(s, kFFFD, 3)) return false;
        memmove(q, q + k, s->n_pending - k);
        s->n_pending = (uint8_t)(s->n_pending - k);
    }
    return true;
}

/* A <0xNN> piece inside a byte-fallback run. */
static bool feed_run(kiln_tok_stream *s, uint8_t b) {
    s->in_run = true;
    if (s->run_bad) return emit(s, kFFFD, 3);
    s->pending[s->n_pending++] = b;
    size_t good = kiln_utf8_valid_prefix(s->pending, s->n_pending);
    if (good == s->n_pending) {
        bool ok = emit(s, s->pending, good);
        s->n_pending = 0;
        return ok;
    }
    int need = kiln_utf8_lead_len(s->pending[0]);
    bool prefix_ok = need > s->n_pending;
    if (prefix_ok) { /* still a valid beginning? */
        uint8_t lo = 0x80, hi = 0xBF, c0 = s->pending[0];
        if (c0 == 0xE0) lo = 0xA0;
        else if (c0 == 0xED) hi = 0x9F;
        else if (c0 == 0xF0) lo = 0x90;
        else if (c0 == 0xF4) hi = 0x8F;
        for (int k = 1; k < s->n_pending && prefix_ok; k++) {
            uint8_t c = s->pending[k];
            prefix_ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
        }
    }
    if (prefix_ok) return true;
    /* the run is not valid UTF-8: HF turns every byte of it into U+FFFD */
    s->run_bad = true;
    bool ok = true;
    for (int k = 0; ok && k < s->n_pending; k++) ok = emit(s, kFFFD, 3);
    s->n_pending = 0;
    return ok;
}

static bool end_run(kiln_tok_stream *s) {
    bool ok = true;
    if (s->in_run)
        for (int k = 0; ok && k < s->n_pending; k++) ok = emit(s, kFFFD, 3);
    s->in_run = s->run_bad = false;
    s->n_pending = 0;
    return ok;
}

static kiln_status stream_result(kiln_tok_stream *s, bool ok, const char **text, size_t *len, kiln_error *err) {
    if (!ok || !kiln_buf_reserve(&s->out, 1)) return kiln_err(err, KILN_ERR_NOMEM, "tokenizer: out of memory in the decode stream");
    s->out.data[s->out.len] = 0;
    *text = (const char *)s->out.data;
    if (len) *len = s->out.len;
    return KILN_OK;
}

kiln_status kiln_tok_stream_push(kiln_tok_stream *s, int32_t id, const char **text, size_t *len, kiln_error *err) {
    const kiln_tokenizer *t = s->tok;
    s->out.len = 0;
    *text = NULL;
    kiln_status st = check_id(t, id, 0, err);
    if (st != KILN_OK) return st;
    bool ok = true;
    if (!(s->skip_special && (t->id_kind[id] & 4))) {
        const uint8_t *p = tok_bytes(t, t->dec_piece[id]);
        size_t n = t->dec_piece[id].len;
        if (t->dec_byte_level) {
            for (size_t i = 0; ok && i < n; i++) ok = feed_lossy(s, p[i]);
        } else if (t->dec_byte[id] >= 0) {
            ok = feed_run(s, (uint8_t)t->dec_byte[id]);
        } else {
            ok = end_run(s) && emit(s, p, n);
        }
    }
    return stream_result(s, ok, text, len, err);
}

kiln_status kiln_tok_stream_finish(kiln_tok_stream *s, const char **text, size_t *len, kiln_error *err) {
    s->out.len = 0;
    *text = NULL;
    bool ok = true;
    if (s->tok->dec_byte_level) {
        if (s->n_pending) ok = emit(s, kFFFD, 3); /* an unfinished character at the end: one U+FFFD */
        s->n_pending = 0;
    } else {
        ok = end_run(s);
    }
    return stream_result(s, ok, text, len, err);
}

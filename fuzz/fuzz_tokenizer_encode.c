/*
 * fuzz_tokenizer_encode.c — libFuzzer target for the tokenizer runtime:
 * encode, decode and the decode stream on arbitrary bytes with the three
 * real tokenizers (llama2, llama3, qwen3), compiled and loaded once.
 *
 * Input: byte 0 picks the tokenizer (bits 0-1, 3 = all) and the flags
 * (bits 2-3); the rest is the text. Invariants checked on every input:
 *   - invalid UTF-8 is refused with KILN_ERR_TOKENIZER, never a crash;
 *   - every id is inside the vocabulary;
 *   - llama3 (byte-level, no normalizer) round-trips: decode(encode(x)) == x;
 *   - the decode stream yields whole UTF-8 characters only and, for the
 *     byte-level tokenizers, exactly the full decode;
 *   - the input bytes read as ids (mod vocabulary) decode without faults.
 *
 * The tokenizers come from $KILN_SHARED_DIR/tokenizers, else from the
 * shared/ folder beside the source tree.
 *
 *   ./fuzz_tokenizer_encode -max_total_time=30 fuzz/corpus/tokenizer_encode
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../compiler/kiln_tokjson.h"
#include "../runtime/kiln_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kiln_tokenizer *g_tok[3]; /* loaded once for the whole fuzzing run (read-only afterwards) */

static void load_all(void) {
    static const char *names[3] = {"llama2", "llama3", "qwen3"};
    const char *shared = getenv("KILN_SHARED_DIR");
    char base[4096];
    if (shared) {
        snprintf(base, sizeof base, "%s", shared);
    } else { /* <source>/fuzz/this.c → <source>/../shared */
        snprintf(base, sizeof base, "%s", __FILE__);
        char *slash = strrchr(base, '/');
        if (slash) *slash = 0;
        slash = strrchr(base, '/');
        if (slash) *slash = 0;
        strncat(base, "/../shared", sizeof base - strlen(base) - 1);
    }
    for (int i = 0; i < 3; i++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/tokenizers/%s", base, names[i]);
        kiln_error err = {0};
        if (kiln_tokenizer_load_json(dir, &g_tok[i], &err) != KILN_OK) {
            fprintf(stderr, "fuzz_tokenizer_encode: %s\nhint: set KILN_SHARED_DIR\n", err.msg);
            abort();
        }
    }
}

static bool whole_utf8(const char *p, size_t n) {
    const unsigned char *s = (const unsigned char *)p;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t need = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!need || i + need > n) return false;
        for (size_t k = 1; k < need; k++)
            if ((s[i + k] & 0xC0) != 0x80) return false;
        i += need;
    }
    return true;
}

static void check_decode(const kiln_tokenizer *tok, const int32_t *ids, size_t n, bool byte_level, bool skip) {
    kiln_error err;
    char *full;
    size_t full_len;
    if (kiln_tokenizer_decode(tok, ids, n, skip, &full, &full_len, &err) != KILN_OK) abort();
    if (!whole_utf8(full, full_len) || full[full_len] != 0) abort();
    kiln_tok_stream s;
    kiln_tok_stream_init(&s, tok, skip);
    kiln_buf all = {0};
    const char *piece;
    size_t plen;
    for (size_t i = 0; i < n; i++) {
        if (kiln_tok_stream_push(&s, ids[i], &piece, &plen, &err) != KILN_OK) abort();
        if (!whole_utf8(piece, plen)) abort();
        kiln_buf_append(&all, piece, plen);
    }
    if (kiln_tok_stream_finish(&s, &piece, &plen, &err) != KILN_OK || !whole_utf8(piece, plen)) abort();
    kiln_buf_append(&all, piece, plen);
    if (byte_level && (all.len != full_len || (full_len && memcmp(all.data, full, full_len) != 0))) abort();
    kiln_tok_stream_free(&s);
    kiln_buf_free(&all);
    free(full);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok[0]) load_all();
    if (size == 0) return 0;
    unsigned sel = data[0] & 3, flags = (data[0] >> 2) & 3;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    for (unsigned w = 0; w < 3; w++) {
        if (sel != 3 && sel != w) continue;
        const kiln_tokenizer *tok = g_tok[w];
        uint32_t vocab = kiln_tokenizer_vocab_size(tok);
        int32_t *ids = NULL;
        size_t n = 0;
        kiln_error err;
        kiln_status st = kiln_tokenizer_encode(tok, text, len, flags, &ids, &n, &err);
        if (st == KILN_ERR_TOKENIZER) {
            if (!strstr(err.msg, "byte offset") || ids || n) abort();
        } else if (st != KILN_OK) {
            abort();
        } else {
            for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || (uint32_t)ids[i] >= vocab) abort();
            check_decode(tok, ids, n, w != 0, false);
            check_decode(tok, ids, n, w != 0, true);
            if (w == 1 && !(flags & KILN_TOK_ADD_SPECIAL)) { /* llama3 is lossless */
                char *back;
                size_t bl;
                if (kiln_tokenizer_decode(tok, ids, n, false, &back, &bl, &err) != KILN_OK || bl != len ||
                    (len && memcmp(back, text, len) != 0))
                    abort();
                free(back);
            }
        }
        free(ids);
        /* the input read as ids */
        size_t m = len / 3;
        int32_t *raw = malloc((m + 1) * sizeof *raw);
        for (size_t i = 0; i < m; i++) {
            uint32_t v = (uint32_t)(uint8_t)text[3 * i] | (uint32_t)(uint8_t)text[3 * i + 1] << 8 |
                         (uint32_t)(uint8_t)text[3 * i + 2] << 16;
            raw[i] = (int32_t)(v % vocab);
        }
        check_decode(tok, raw, m, w != 0, data[0] & 0x10);
        free(raw);
    }
    return 0;
}

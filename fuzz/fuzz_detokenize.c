/*
 * fuzz_detokenize.c — libFuzzer target for `kiln tokenize --decode`: the ids
 * text parser (kiln_tokenize_parse_ids, compiler/cmd_tokenize.c) and the
 * decoders over real tokenizer blobs, built once from the tokenizer.json
 * files embedded in fuzz/tiny_tokenizer.h (a SentencePiece-style one without
 * byte fallback, and a byte-level one), so nothing is read at run time.
 * Checks: parse gives OK or a message; decode gives OK or a message; the
 * result is NUL-terminated at its length; and the streaming decoder
 * (kiln_tok_stream) returns exactly the full decode — neither tokenizer has
 * byte fallback, the one case where the two may differ (kiln_tokenizer.h).
 * Input: byte 0 bit 0 = skip_special, bit 1 = the byte-level tokenizer; the
 * rest is the text given on stdin, e.g. "[1, 50, 60]".
 *   ./fuzz_detokenize -max_total_time=30 fuzz/corpus/detokenize
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../compiler/kiln_tokjson.h"
#include "../runtime/kiln_tokenizer.h"
#include "tiny_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kiln_tokenizer *build(const char *json, size_t len, const char *config) {
    kiln_buf blob = {0};
    kiln_error err = {0};
    kiln_tokenizer *tok = NULL;
    if (kiln_tokjson_compile_mem(json, len, config, config ? strlen(config) : 0, "fuzz", &blob, &err) != KILN_OK ||
        kiln_tokenizer_load(blob.data, blob.len, &tok, &err) != KILN_OK)
        abort(); /* the embedded tokenizers are valid */
    kiln_buf_free(&blob);
    return tok;
}

/* Built on the first input and kept for the process (a harness, not library code). */
static const kiln_tokenizer *tokenizer(int which) {
    static kiln_tokenizer *toks[2];
    if (!toks[which])
        toks[which] = which ? build(kByteLevelTokenizerJson, sizeof kByteLevelTokenizerJson - 1, NULL)
                            : build(kTinyTokenizerJson, sizeof kTinyTokenizerJson - 1, kTinyTokenizerConfig);
    return toks[which];
}

static void stream_equals(const kiln_tokenizer *tok, const int32_t *ids, size_t n, bool skip, const char *want,
                          size_t want_len) {
    kiln_tok_stream s;
    kiln_tok_stream_init(&s, tok, skip);
    kiln_buf got = {0};
    kiln_error err = {0};
    const char *piece;
    size_t len;
    for (size_t i = 0; i < n; i++) {
        if (kiln_tok_stream_push(&s, ids[i], &piece, &len, &err) != KILN_OK) abort(); /* decode took every id */
        kiln_buf_append(&got, piece, len);
    }
    if (kiln_tok_stream_finish(&s, &piece, &len, &err) != KILN_OK) abort();
    kiln_buf_append(&got, piece, len);
    if (got.failed || got.len != want_len || (want_len && memcmp(got.data, want, want_len) != 0)) abort();
    kiln_buf_free(&got);
    kiln_tok_stream_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    bool skip = data[0] & 1;
    const kiln_tokenizer *tok = tokenizer(data[0] >> 1 & 1);
    int32_t *ids = NULL;
    size_t n = 0;
    kiln_error err = {0};
    if (kiln_tokenize_parse_ids((const char *)data + 1, size - 1, "stdin", &ids, &n, &err) != KILN_OK) {
        if (!err.msg[0] || ids) abort();
        return 0;
    }
    char *text = NULL;
    size_t len = 0;
    if (kiln_tokenizer_decode(tok, ids, n, skip, &text, &len, &err) == KILN_OK) {
        if (text[len] != 0) abort();
        stream_equals(tok, ids, n, skip, text, len);
        free(text);
    } else if (!err.msg[0]) {
        abort();
    }
    free(ids);
    return 0;
}

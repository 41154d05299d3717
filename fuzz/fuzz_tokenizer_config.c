/*
 * fuzz_tokenizer_config.c — libFuzzer target for the tokenizer_config.json
 * branch of the tokenizer compiler (compiler/tokenizer_json.c): a fixed,
 * valid tokenizer.json (fuzz/tiny_tokenizer.h) with the input as its
 * tokenizer_config.json, through kiln_tokjson_compile_mem. That branch reads
 * bos_token / eos_token (strings, AddedToken objects, lists), add_bos_token /
 * add_eos_token and resolves them to ids; fuzz_tokenizer_json.c never gives
 * a config. Checks: OK or an error with a message; what compiles loads; its
 * bos and eos ids name tokens; an encode with specials starts with bos when
 * the config asks for it, and decodes.
 *   ./fuzz_tokenizer_config -max_total_time=30 fuzz/corpus/tokenizer_config
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../compiler/kiln_tokjson.h"
#include "../runtime/kiln_tokenizer.h"
#include "tiny_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void exercise(const kiln_tokenizer *tok) {
    uint32_t vocab = kiln_tokenizer_vocab_size(tok);
    int32_t bos = kiln_tokenizer_bos(tok);
    const int32_t *eos;
    int n_eos = kiln_tokenizer_eos(tok, &eos);
    if (bos >= 0 && ((uint32_t)bos >= vocab || !kiln_tokenizer_token(tok, bos, &(size_t){0}))) abort();
    if (n_eos < 0 || n_eos > KILN_TOK_MAX_EOS) abort();
    for (int i = 0; i < n_eos; i++)
        if (eos[i] < 0 || (uint32_t)eos[i] >= vocab) abort();
    static const char text[] = "Hello the world <s></s> def fib(n):";
    int32_t *ids = NULL;
    size_t n = 0;
    kiln_error err = {0};
    if (kiln_tokenizer_encode(tok, text, sizeof text - 1, KILN_TOK_ADD_SPECIAL, &ids, &n, &err) != KILN_OK) abort();
    char *out = NULL;
    size_t len;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= vocab) abort();
    if (kiln_tokenizer_decode(tok, ids, n, true, &out, &len, &err) != KILN_OK) abort();
    free(out);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_buf blob = {0};
    kiln_error err = {0};
    kiln_status st = kiln_tokjson_compile_mem(kTinyTokenizerJson, sizeof kTinyTokenizerJson - 1, (const char *)data,
                                              size, "fuzz/tokenizer.json", &blob, &err);
    if (st == KILN_OK) {
        kiln_tokenizer *tok = NULL;
        if (kiln_tokenizer_load(blob.data, blob.len, &tok, &err) != KILN_OK) abort(); /* what compiles must load */
        exercise(tok);
        kiln_tokenizer_free(tok);
    } else if (!err.msg[0]) {
        abort();
    }
    kiln_buf_free(&blob);
    return 0;
}

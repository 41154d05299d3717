/*
 * fuzz_tokenizer_json.c — libFuzzer target for the tokenizer compiler and
 * the blob loader: any bytes as tokenizer.json (kiln_tokjson_compile_mem)
 * and, separately, as a tokenizer blob (kiln_tokenizer_load) must give
 * KILN_OK or a clean error with a message. Whatever compiles or loads is
 * then used: a short encode/decode must not fault.
 *
 * Input: byte 0 bit 0 chooses the view (0 = JSON, 1 = blob); the rest is
 * the document. The seed corpus holds small tokenizer.json files and blobs.
 *
 *   ./fuzz_tokenizer_json -max_total_time=30 fuzz/corpus/tokenizer_json
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../compiler/kiln_tokjson.h"
#include "../runtime/kiln_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void exercise(const kiln_tokenizer *tok) {
    static const char *texts[] = {"Hello world", "  a\n\tb <s> <|im_start|> e\xCC\x81 \xE4\xB8\xAD 123456", ""};
    for (int i = 0; i < 3; i++) {
        for (unsigned flags = 0; flags < 4; flags++) {
            int32_t *ids = NULL;
            size_t n = 0;
            kiln_error err;
            if (kiln_tokenizer_encode(tok, texts[i], strlen(texts[i]), flags, &ids, &n, &err) == KILN_OK) {
                char *out;
                size_t len;
                for (size_t k = 0; k < n; k++)
                    if (ids[k] < 0 || (uint32_t)ids[k] >= kiln_tokenizer_vocab_size(tok)) abort();
                if (kiln_tokenizer_decode(tok, ids, n, flags & 1, &out, &len, &err) == KILN_OK) free(out);
                else abort();
            } else if (!err.msg[0]) {
                abort();
            }
            free(ids);
        }
    }
    int32_t probe[4] = {0, 1, 2, (int32_t)kiln_tokenizer_vocab_size(tok) - 1};
    char *out;
    size_t len;
    kiln_error err;
    if (kiln_tokenizer_decode(tok, probe, 4, false, &out, &len, &err) == KILN_OK) free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    kiln_error err;
    err.msg[0] = 0;
    if (data[0] & 1) {
        kiln_tokenizer *tok = NULL;
        if (kiln_tokenizer_load(data + 1, size - 1, &tok, &err) == KILN_OK) {
            exercise(tok);
            kiln_tokenizer_free(tok);
        } else if (tok || !err.msg[0]) {
            abort();
        }
        return 0;
    }
    kiln_buf blob = {0};
    kiln_status st = kiln_tokjson_compile_mem((const char *)data + 1, size - 1, NULL, 0, "fuzz/tokenizer.json", &blob, &err);
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

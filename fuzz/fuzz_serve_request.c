/*
 * fuzz_serve_request.c — libFuzzer target for `kiln serve`'s request body
 * parser (compiler/serve_request.c): any byte string, as the body of each
 * endpoint (the first byte picks it), must give KILN_OK or a clean 400/500
 * error with a message, and on success the request must be in range (ids
 * >= 0, at most 16 non-empty stop strings of at most 256 bytes, messages
 * with a role and content, sampling values inside their limits).
 *
 *   ./fuzz_serve_request -max_total_time=60 fuzz/corpus/serve_request
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../compiler/serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_request(const serve_request *r) {
    if (r->n_stops < 0 || r->n_stops > SERVE_MAX_STOPS) abort();
    for (int i = 0; i < r->n_stops; i++)
        if (!r->stops[i] || !r->stops[i][0] || strlen(r->stops[i]) > SERVE_MAX_STOP_BYTES) abort();
    /* the server's matcher needs every stop non-empty: a NUL inside would cut it to "" */
    if ((r->prompt_ids != NULL) != (r->n_prompt_ids > 0)) abort();
    for (int32_t i = 0; i < r->n_prompt_ids; i++)
        if (r->prompt_ids[i] < 0) abort();
    for (int32_t i = 0; i < r->n_messages; i++)
        if (!r->messages[i].role || !r->messages[i].content) abort();
    if (r->prompt && strlen(r->prompt) > r->prompt_len) abort();
    if (r->max_tokens < -1 || r->max_tokens > (1 << 24)) abort();
    if (r->temperature != -1 && !(r->temperature >= 0 && r->temperature <= 1e6)) abort();
    if (r->top_p != -1 && !(r->top_p > 0 && r->top_p <= 1)) abort();
    if (r->top_k < -1) abort();
    switch (r->kind) {
    case SERVE_KIND_COMPLETION:
        if (!r->model || (!r->prompt && !r->prompt_ids)) abort();
        break;
    case SERVE_KIND_CHAT:
        if (!r->model || r->n_messages < 1) abort();
        break;
    case SERVE_KIND_TOKENIZE:
        if (!r->prompt && r->n_messages < 1) abort();
        break;
    case SERVE_KIND_DETOKENIZE:
        if (r->n_prompt_ids < 1) abort();
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    serve_kind kind = (serve_kind)(data[0] % 4);
    serve_request r;
    serve_error err;
    memset(&err, 0, sizeof err);
    if (serve_request_parse((const char *)data + 1, size - 1, kind, &r, &err) != KILN_OK) {
        if ((err.http != 400 && err.http != 500) || !err.message[0] || !err.type) abort();
        return 0;
    }
    check_request(&r);
    serve_request_free(&r);
    return 0;
}

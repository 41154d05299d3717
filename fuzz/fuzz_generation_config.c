/*
 * fuzz_generation_config.c — libFuzzer target for the generation_config.json
 * parser and its resolution (compiler/generation_config.c): any byte string
 * must give KILN_OK or a clean error, and on success the values an engine
 * would carry must be in range (ids inside the vocabulary, greedy or a
 * positive temperature, top_p in (0, 1] when sampling, top_k >= 0).
 *
 *   ./fuzz_generation_config -max_total_time=60 fuzz/corpus/generation_config
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../compiler/kiln_compiler.h"

#define VOCAB 1000

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_ids(const kiln_generation *r) {
    if (r->bos_token_id < -1 || r->bos_token_id >= VOCAB || r->pad_token_id < -1 || r->pad_token_id >= VOCAB ||
        r->n_eos < 0 || r->n_eos > KILN_MAX_EOS)
        abort();
    for (int i = 0; i < r->n_eos; i++)
        if (r->eos_token_ids[i] < 0 || r->eos_token_ids[i] >= VOCAB) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_generation_config g;
    kiln_error err;
    if (kiln_generation_config_parse((const char *)data, size, "fuzz/generation_config.json", VOCAB, &g, &err) !=
        KILN_OK)
        return 0;
    kiln_model_config c = {.vocab_size = VOCAB, .bos_token_id = -1};
    kiln_generation r;
    kiln_generation_resolve(&c, &g, &r);
    check_ids(&r);
    if (!r.do_sample && (r.temperature != 0 || r.top_k != 0 || r.top_p != 1)) abort();
    if (r.do_sample && (!(r.temperature > 0) || !(r.top_p > 0 && r.top_p <= 1) || r.top_k < 0 || r.top_k > VOCAB))
        abort();
    if (!r.not_applied || strlen(r.not_applied) >= sizeof g.not_applied) abort();
    if (!r.ids_src || !r.do_sample_src || !r.temperature_src || !r.top_k_src || !r.top_p_src) abort();
    return 0;
}

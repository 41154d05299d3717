/*
 * fuzz_engine_load.c — libFuzzer target for the whole engine load path, past
 * where fuzz_engine.c stops: the input, resealed (fuzz_reseal.h) so its
 * checksums hold, is written to a memory file and opened with
 * kiln_model_open_ex as `kiln run` and `kiln inspect` open it: the plan parsed
 * and checked against the weights section, the meta JSON read (generation
 * ids), the tokenizer loaded and the weights converted to f32. An engine that
 * loads then goes through kiln_inspect_verify (meta against plan, weights,
 * tokenizer, kernels section) and, when it has a tokenizer, a short
 * encode/decode. Checks: every failure is an error with a message; bos and
 * eos ids the loader keeps lie inside the vocabulary.
 *
 * Seeds: fuzz/corpus/engine_load/ — small engines compiled from
 * tests/data/tiny-mistral (bf16, f32, compressed, with the tiny tokenizer
 * and a kernels section); fuzz/data/make_engine_load_seeds.sh remakes them.
 *   ./fuzz_engine_load -max_total_time=30 fuzz/corpus/engine_load
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../compiler/cli.h"
#include "../runtime/kiln_rt.h"
#include "../runtime/kiln_tokenizer.h"
#include "fuzz_reseal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Inputs larger than this are skipped (the seeds are ~250 KB). */
#define FUZZ_MAX_INPUT (4u << 20)

static void exercise(const kiln_model *m) {
    if (m->bos_id < -1 || m->bos_id >= m->plan->vocab_size) abort();
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos_ids[i] < 0 || m->eos_ids[i] >= m->plan->vocab_size) abort();
    kiln_error err = {0};
    kiln_inspect_kernels k;
    if (kiln_inspect_verify(m, &k, &err) != KILN_OK && !err.msg[0]) abort();
    if (!m->tokenizer) return;
    int32_t *ids = NULL;
    size_t n = 0;
    if (kiln_tokenizer_encode(m->tokenizer, "Hello the world", 15, KILN_TOK_ADD_SPECIAL, &ids, &n, &err) == KILN_OK) {
        char *text = NULL;
        size_t len;
        if (kiln_tokenizer_decode(m->tokenizer, ids, n, true, &text, &len, &err) != KILN_OK) abort();
        free(text);
    }
    free(ids);
}

static void load(const uint8_t *bytes, size_t size) {
    int fd = memfd_create("fuzz.kiln", 0);
    if (fd < 0) return;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, bytes + done, size - done);
        if (w <= 0) break;
        done += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    kiln_model *m = NULL;
    kiln_error err = {0};
    if (done == size) {
        if (kiln_model_open_ex(path, 2, 0, &m, &err) == KILN_OK) {
            exercise(m);
            kiln_model_close(m);
        } else if (m || !err.msg[0]) {
            abort();
        }
    }
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < KILN_ENGINE_HEADER_SIZE || size > FUZZ_MAX_INPUT) return 0;
    uint8_t *copy = malloc(size);
    if (!copy) return 0;
    memcpy(copy, data, size);
    kiln_fuzz_reseal(copy, size);
    load(copy, size);
    free(copy);
    return 0;
}
